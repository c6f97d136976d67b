//! What a long benchmark says while it runs: a spinner naming the phase
//! (on a terminal, not with `--json`) and a line on stderr for each result
//! as it comes, so a run of many minutes shows its rounds as they finish.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// The running bench's voice on stderr.
pub struct Progress {
    bar: ProgressBar,
    started: std::time::Instant,
}

impl Progress {
    /// A spinner when stderr is a terminal and the output is not JSON.
    pub fn new(json: bool) -> Progress {
        let bar = ProgressBar::new_spinner();
        if json || !std::io::stderr().is_terminal() {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        } else {
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
        }
        Progress {
            bar,
            started: std::time::Instant::now(),
        }
    }

    /// The phase now running: the spinner's message, or a line with the
    /// time since the start when there is no spinner.
    pub fn phase(&self, message: impl Into<String>) {
        let message = message.into();
        if self.bar.is_hidden() {
            let at = self.started.elapsed().as_secs_f64();
            eprintln!("bench: {message} (at {at:.1} s)");
        }
        self.bar.set_message(message);
    }

    /// A result, kept on the screen.
    pub fn line(&self, message: impl AsRef<str>) {
        if self.bar.is_hidden() {
            eprintln!("bench: {}", message.as_ref());
        } else {
            self.bar.println(format!("bench: {}", message.as_ref()));
        }
    }

    /// Clears the spinner.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
