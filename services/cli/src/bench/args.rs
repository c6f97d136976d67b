//! Parsers of the benches' repeatable options: a variable for the
//! services (`--env NAME=value`) and a PostgreSQL setting
//! (`--pg-setting name=value`), each checked before anything starts.

/// `NAME=value`, NAME an environment variable's name.
pub fn env_pair(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected NAME=value"))?;
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!("{name:?} is not a variable's name"));
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// `name=value`, name a PostgreSQL setting's name.
pub fn pg_setting(text: &str) -> Result<String, String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected name=value"))?;
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    if !valid || value.is_empty() {
        return Err(format!("{text:?}: expected a setting's name=value"));
    }
    Ok(format!("{name}={value}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_before_anything_starts() {
        assert_eq!(
            env_pair("CAPTURE_AT=shipment"),
            Ok(("CAPTURE_AT".into(), "shipment".into()))
        );
        assert_eq!(env_pair("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert!(env_pair("1A=x").is_err());
        assert!(env_pair("NOVALUE").is_err());
        assert_eq!(pg_setting("work_mem=64MB"), Ok("work_mem=64MB".into()));
        assert!(pg_setting("x; DROP=1").is_err());
    }
}
