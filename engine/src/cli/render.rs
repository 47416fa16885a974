//! How reports print for a person: summaries, tables, ages, spinners.
//!
//! Every line a person reads goes through `say!` (or `clean`): strings from store records
//! (facts, compat keys, writer ids, a policy's words, error details) are anyone's, and a control
//! character in them would let a record move the cursor, erase lines or write a line that looks
//! like jitship's own ("signed by trusted key ..."). JSON output is JSON and is not touched.

pub(crate) mod policy;
pub(crate) mod store;
pub(crate) mod worker;

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

/// `text` with its control characters escaped (`\n`, `\u{1b}`, ...), and the bidirectional
/// overrides and isolates that reorder what a terminal shows; other characters, non-ASCII
/// included, unchanged.
pub(crate) fn clean(text: &str) -> std::borrow::Cow<'_, str> {
    escape(text, |c| c.is_control() || bidi(c))
}

fn bidi(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn escape(text: &str, bad: impl Fn(char) -> bool) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(&bad) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if bad(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Where text log lines go: stderr, each event's line escaped like `clean`, but for ESC (tracing
/// escapes ESC in what it formats itself, and colors its own output with it). Log lines name
/// store records too, and tracing leaves CR and LF in them: a record could forge a line.
pub(crate) struct LogWriter;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LogWriter
    }
}

impl std::io::Write for LogWriter {
    /// tracing writes one event per call, ending in its line break.
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (line, end) = match text.strip_suffix('\n') {
            Some(line) => (line, "\n"),
            None => (&*text, ""),
        };
        let line = escape(line, |c| (c.is_control() && c != '\u{1b}') || bidi(c));
        std::io::stderr().write_all(format!("{line}{end}").as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Prints one line for a person, escaped (`clean`): a line holds no line break of its own.
pub(crate) fn say_line(line: &str) {
    println!("{}", clean(line));
}

/// `println!` for a person: the formatted line, escaped (`clean`).
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::cli::render::say_line(&format!($($arg)*))
    };
}
pub(crate) use say;

/// A command's own JSON document on stdout (`--json` of the commands without an envelope: the
/// policy author's).
pub(crate) fn json(value: &impl serde::Serialize) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        Err(e) => eprintln!("error: cannot print the JSON report: {e}"),
    }
}

/// How much a person sees: 0 = one line per cache, 1+ (`-v`) = the figures and every skip reason.
static VERBOSITY: AtomicU8 = AtomicU8::new(0);

pub(crate) fn set_verbosity(v: u8) {
    VERBOSITY.store(v, Ordering::Relaxed);
}

pub(super) fn verbose() -> bool {
    VERBOSITY.load(Ordering::Relaxed) > 0
}

/// A spinner with the elapsed time on a terminal; off a terminal, one log line and nothing else
/// (no escape codes in `kubectl logs`).
pub(crate) fn spinner(message: String) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        tracing::info!("{message}");
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner().with_message(message);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// The progress shown while one cache is worked on.
pub(crate) struct Progress(indicatif::ProgressBar);

impl Progress {
    pub(crate) fn start(message: String) -> Self {
        Self(spinner(message))
    }

    pub(crate) fn finish(self) {
        self.0.finish_and_clear();
    }
}

/// `kind: what: why` on stderr, for a cache whose work failed.
pub(crate) fn print_failed(kind: &str, what: &str, why: &str) {
    eprintln!("{}", clean(&format!("{kind}: {what}: {why}")));
}

/// `  root DIR (where it came from)` when the environment decided the root (a kind given
/// without `=ROOT`); under `-v` for every root.
pub(crate) fn print_root(root: &std::path::Path, resolved_from: Option<&str>) {
    match resolved_from {
        Some(origin) => say!("  root {} ({origin})", root.display()),
        None if verbose() => say!("  root {} (given)", root.display()),
        None => {}
    }
}

/// `error: ...` on stderr, each cause once, never in Debug form.
pub(crate) fn print_error(e: &anyhow::Error) {
    eprintln!("error: {}", clean(&super::output::one_line(e)));
}

/// "45s", "12m", "3h", "5d" ago.
pub(crate) fn age(then: u64) -> String {
    let s = crate::catalog::now_secs().saturating_sub(then);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

pub(crate) fn short(id: &impl std::fmt::Display) -> String {
    id.to_string().chars().take(12).collect()
}

/// Prints rows as left-aligned columns under a header.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        say!("{}", out.trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::clean;

    #[test]
    fn clean_escapes_control_characters_and_bidi_overrides_only() {
        assert_eq!(
            clean("gpu: NVIDIA H100 — ünïcode ✓"),
            "gpu: NVIDIA H100 — ünïcode ✓"
        );
        assert_eq!(
            clean("ok\u{1b}[2K\rsigned by trusted key\nx\u{7}\t"),
            "ok\\u{1b}[2K\\rsigned by trusted key\\nx\\u{7}\\t"
        );
        assert_eq!(clean("a\u{202e}b\u{2066}c"), "a\\u{202e}b\\u{2066}c");
        assert!(matches!(clean("plain"), std::borrow::Cow::Borrowed(_)));
    }
}
