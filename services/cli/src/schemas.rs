//! The event schemas of `proto/events/` (embedded by `events`), compiled
//! for validating what the stream holds.

use std::collections::HashMap;

/// Compiled validators for every known event type.
pub struct Schemas(HashMap<String, jsonschema::Validator>);

impl Schemas {
    /// Compiles the embedded schemas.
    pub fn load() -> anyhow::Result<Self> {
        let mut map = HashMap::new();
        for (type_name, text) in events::schemas::SCHEMAS {
            let ty = events::names::event_type(type_name);
            let schema: serde_json::Value = serde_json::from_str(text)?;
            let validator = jsonschema::validator_for(&schema)
                .map_err(|e| anyhow::anyhow!("schema of {ty}: {e}"))?;
            map.insert(ty, validator);
        }
        Ok(Schemas(map))
    }

    /// `Ok` if the message is a valid event of a known type, else why not.
    pub fn check(&self, event: &serde_json::Value) -> Result<(), String> {
        let ty = event
            .get("type")
            .and_then(|t| t.as_str())
            .ok_or("no type attribute")?;
        let validator = self
            .0
            .get(ty)
            .ok_or_else(|| format!("unknown event type or version {ty}"))?;
        let errors: Vec<String> = validator
            .iter_errors(event)
            .take(3)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{ty} does not match its schema: {}",
                errors.join("; ")
            ))
        }
    }
}
