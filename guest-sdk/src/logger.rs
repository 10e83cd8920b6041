//! The `log` crate's backend in a guest: `log::info!` and the rest write to the host's log
//! through `host.log`, tagged with the process's pid like [`Ctx::log`](crate::Ctx::log).
//!
//! Installed by the SDK's `init`, before the entry runs, with every level let through:
//! the host filters what it shows (`RUST_LOG`, `-v`, `-q`). A guest that wants fewer
//! records formatted at all lowers `log::set_max_level` in its entry.

use crate::payload::Level;

struct HostLogger;

static LOGGER: HostLogger = HostLogger;

/// Makes the host's log the `log` crate's logger. Called at every `init`; an instance
/// runs one process, and the SDK's own tests call `init` again, which is then a no-op.
pub(crate) fn install() {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Trace);
    }
}

impl log::Log for HostLogger {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let level = match record.level() {
            log::Level::Error => Level::Error,
            log::Level::Warn => Level::Warn,
            log::Level::Info => Level::Info,
            log::Level::Debug => Level::Debug,
            log::Level::Trace => Level::Trace,
        };
        // A record without arguments is one static string: no formatting, no allocation.
        match record.args().as_str() {
            Some(text) => crate::host::log(level, text),
            None => crate::host::log(level, &record.args().to_string()),
        }
    }

    fn flush(&self) {}
}
