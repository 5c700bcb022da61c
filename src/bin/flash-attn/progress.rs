//! Saying what the tool is doing while it works: a spinner or a bar on stderr when stderr is a
//! terminal, plain lines otherwise (logs, CI, pipes). Results go to stdout, so that `-o json`
//! stays parseable whatever is said here.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// Whether to animate (stderr is a terminal) or print plain lines.
fn animated() -> bool {
    std::io::stderr().is_terminal()
}

/// One phase of work, shown while it runs and replaced by its outcome line when it ends.
pub struct Phase {
    spinner: Option<ProgressBar>,
}

impl Phase {
    /// Starts a phase described by `what` (e.g. `building and running the flash kernel`).
    pub fn start(what: impl Into<String>) -> Phase {
        let what = what.into();
        if !animated() {
            eprintln!("{what} ...");
            return Phase { spinner: None };
        }
        let spinner = ProgressBar::new_spinner().with_message(what);
        spinner.set_style(
            ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        spinner.enable_steady_tick(Duration::from_millis(100));
        Phase { spinner: Some(spinner) }
    }

    /// Ends the phase with its outcome on a line of its own.
    pub fn finish(self, outcome: impl AsRef<str>) {
        if let Some(spinner) = &self.spinner {
            spinner.finish_and_clear();
        }
        eprintln!("{}", outcome.as_ref());
    }
}

impl Drop for Phase {
    /// A phase left by an error clears its spinner, so that the error message is not drawn over.
    fn drop(&mut self) {
        if let Some(spinner) = &self.spinner {
            spinner.finish_and_clear();
        }
    }
}

/// A bar over `len` steps, each labelled by [`ProgressBar::set_message`]. Hidden when stderr is
/// not a terminal: the caller then prints what it wants kept instead.
pub fn bar(len: usize, what: &str) -> ProgressBar {
    if !animated() {
        eprintln!("{what}: {len} runs ...");
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len as u64).with_prefix(what.to_string());
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {elapsed} {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}
