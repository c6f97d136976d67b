//! What `up` tells its children and the operator's shell: each service's
//! environment (up's defaults, a fresh webhook secret, then the operator's
//! own settings) and the env file's exports. Reads the process environment;
//! never starts anything.

use base64::Engine;

/// Where the system's parts are reached: derived once, read by the
/// services' environment, the readiness checks and the env file.
pub(super) struct Urls {
    pub(super) checkout: String,
    pub(super) psp_addr: String,
    pub(super) database: String,
    pub(super) nats: String,
}

/// The console up starts: its address and the operator token it asks for.
pub(super) struct ConsoleSite {
    pub(super) addr: String,
    pub(super) token: String,
}

/// Every service's environment as up would set it, with a fresh webhook
/// signing secret; the operator's own settings come later.
pub(super) fn default_env(
    urls: &Urls,
    checkout_addr: &str,
    worker_threads: usize,
) -> Vec<(&'static str, String)> {
    let secret = webhook_secret();
    let (checkout_url, psp_addr) = (&urls.checkout, &urls.psp_addr);
    vec![
        ("PSP_SIM_ADDR", psp_addr.clone()),
        ("PSP_URL", format!("http://{psp_addr}")),
        ("PSP_WEBHOOK_URL", format!("{checkout_url}/v1/psp/webhooks")),
        ("WEBHOOK_SECRET", secret),
        ("PAYMENT_WORKER_ADDR", "127.0.0.1:0".to_owned()),
        ("EXPIRY_ADDR", "127.0.0.1:0".to_owned()),
        ("FULFILLMENT_ADDR", "127.0.0.1:0".to_owned()),
        ("DATABASE_URL", urls.database.clone()),
        ("NATS_URL", urls.nats.clone()),
        ("CHECKOUT_ADDR", checkout_addr.to_owned()),
        ("OUTBOX_RELAY_ADDR", "127.0.0.1:0".to_owned()),
        (
            platform::runtime::WORKER_THREADS,
            worker_threads.to_string(),
        ),
        // A person reads these logs, prefixed with each service's name.
        ("LOG_FORMAT", "text".to_owned()),
    ]
}

/// `env` with each value the operator already set in the environment in
/// place of up's default.
pub(super) fn with_overrides(env: Vec<(&'static str, String)>) -> Vec<(&'static str, String)> {
    // A service address or secret already set in the environment wins over
    // up's default; the addresses up itself derives URLs from do not.
    let derived = [
        "CHECKOUT_ADDR",
        "PSP_SIM_ADDR",
        "PSP_URL",
        "PSP_WEBHOOK_URL",
        "DATABASE_URL",
        "NATS_URL",
    ];
    env.into_iter()
        .map(|(k, v)| {
            match std::env::var(k)
                .ok()
                .filter(|x| !x.is_empty() && !derived.contains(&k))
            {
                Some(given) => (k, given),
                None => (k, v),
            }
        })
        .collect()
}

/// The env file's text: exports a shell sources to reach this system
/// (`PSP_URL` is psp-sim's, e.g. for its `/admin/faults`).
pub(super) fn exports(urls: &Urls, token: &str, console: Option<&ConsoleSite>) -> String {
    let Urls {
        checkout: checkout_url,
        database: database_url,
        nats: nats_url,
        psp_addr,
    } = urls;
    format!(
        "export DATABASE_URL='{database_url}'\nexport NATS_URL='{nats_url}'\nexport CHECKOUT_URL='{checkout_url}'\nexport PSP_URL='http://{psp_addr}'\nexport SOLDONCE_TOKEN='{token}'\n{}",
        if let Some(ConsoleSite { addr: console_addr, token: console_token }) = console {
            format!("export CONSOLE_URL='http://{console_addr}/'\nexport CONSOLE_TOKEN='{console_token}'\n")
        } else {
            String::new()
        }
    )
}

/// A webhook signing secret of 32 random bytes (`whsec_…`): a fresh key per
/// run, never a shipped one.
pub(crate) fn webhook_secret() -> String {
    let key: Vec<u8> = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()]
        .iter()
        .flat_map(|u| *u.as_bytes())
        .collect();
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    )
}
