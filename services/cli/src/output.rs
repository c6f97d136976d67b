//! Printing results as text or, with `--json`, as JSON.

use serde::Serialize;

/// Where and how results are printed.
pub struct Output {
    pub json: bool,
}

impl Output {
    /// Prints `value` as JSON, or `text` for people.
    pub fn print<T: Serialize>(&self, value: &T, text: impl FnOnce() -> String) {
        if self.json {
            println!("{}", serde_json::to_string(value).unwrap_or_default());
        } else {
            println!("{}", text());
        }
    }
}
