//! How long a buyer's 3-D Secure action extends a reservation, read once
//! at start by every service that learns of payments.

/// How long a reservation is extended, once, for a buyer's 3-D Secure
/// action: `ACTION_EXTENSION` as the service read it at start (10 minutes
/// unless set; at most [`domain::action::MAX_EXTENSION`]).
static ACTION_EXTENSION: std::sync::OnceLock<chrono::Duration> = std::sync::OnceLock::new();

/// Reads `ACTION_EXTENSION` (default 10 minutes, at most an hour): the
/// payment worker and checkout both learn of buyers' challenges, so both
/// read it alike.
pub fn action_extension_setting() -> Result<std::time::Duration, platform::config::ConfigError> {
    let setting = platform::config::var(
        "ACTION_EXTENSION",
        "how much longer a reservation lasts, once, while the buyer completes a 3-D Secure challenge (at most 1h)",
    );
    let d = setting.duration(std::time::Duration::from_secs(600))?;
    if d > std::time::Duration::from_secs(3600) {
        return Err(platform::config::ConfigError::new(
            setting.name(),
            "must be at most 1h",
        ));
    }
    Ok(d)
}

/// Sets the action extension for this process (once, at start).
pub fn set_action_extension(extension: std::time::Duration) {
    let extension = chrono::Duration::from_std(extension)
        .unwrap_or(domain::action::MAX_EXTENSION)
        .min(domain::action::MAX_EXTENSION);
    let _ = ACTION_EXTENSION.set(extension);
}

pub(super) fn action_extension() -> chrono::Duration {
    *ACTION_EXTENSION.get_or_init(|| chrono::Duration::minutes(10))
}
