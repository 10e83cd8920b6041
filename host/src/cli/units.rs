//! Sizes (`64MiB`) and durations (`500ms`) on the command line, parsed by `bytesize` and
//! `humantime` with errors that say what a valid value looks like.

use std::time::Duration;

/// A size in bytes: a number with a unit (`64MiB`, `1GiB`, `512KiB`, `100MB`) or a bare
/// number of bytes.
pub(crate) fn size(text: &str) -> Result<usize, String> {
    let parsed: bytesize::ByteSize = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a size: write a number with a unit, like 64MiB or 1GiB"))?;
    usize::try_from(parsed.as_u64()).map_err(|_| format!("`{text}` is too large for this machine"))
}

/// A [`size`] of at least one byte.
pub(crate) fn nonzero_size(text: &str) -> Result<usize, String> {
    match size(text)? {
        0 => Err(format!("`{text}` is zero: the size must be at least 1 byte")),
        bytes => Ok(bytes),
    }
}

/// A memory cap: a [`size`] of at least one Wasm page (64 KiB).
pub(crate) fn memory(text: &str) -> Result<usize, String> {
    let bytes = size(text)?;
    if bytes < 64 * 1024 {
        return Err(format!("`{text}` is less than one Wasm page: the memory cap must be at least 64KiB"));
    }
    Ok(bytes)
}

/// A count of at least one (`--mailbox`, `--max-yields`).
pub(crate) fn positive(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err(format!("`{text}` is zero: the count must be at least 1")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{text}` is not a count: write a whole number, like 1024")),
    }
}

/// `bytes` as a flag's value is written, in the largest binary unit that divides it
/// (`16MiB`, `1GiB`, `1000B`): how `--help` shows a size's default, which [`size`] reads
/// back as the same number.
pub(crate) fn size_text(bytes: usize) -> String {
    let units = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    match units.iter().find(|(unit, _)| bytes != 0 && bytes.is_multiple_of(*unit)) {
        Some((unit, name)) => format!("{}{name}", bytes / unit),
        None => format!("{bytes}B"),
    }
}

/// `duration` as a flag's value is written (`10ms`, `30s`): how `--help` shows a
/// duration's default, which [`duration`] reads back as the same.
pub(crate) fn duration_text(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// A duration with a unit: `500ms`, `2s`, `1m 30s`.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("`{text}` needs a unit: write 500ms, 2s or 1m"));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration ({e}): write it like 500ms, 2s or 1m 30s"))
}

/// A threshold that can be turned off: a duration, or `never` (or `0`) for none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Threshold(pub(crate) Option<Duration>);

/// Reads a [`Threshold`]: `never`, `0`, or a duration with a unit.
pub(crate) fn threshold(text: &str) -> Result<Threshold, String> {
    match text.trim() {
        "never" | "0" => Ok(Threshold(None)),
        _ => match duration(text) {
            Ok(duration) if duration.is_zero() => Ok(Threshold(None)),
            Ok(duration) => Ok(Threshold(Some(duration))),
            Err(error) => Err(format!("{error}, or `never`")),
        },
    }
}

/// A duration where a bare number means milliseconds (`--time-slice 50`).
pub(crate) fn millis(text: &str) -> Result<Duration, String> {
    match text.trim().parse::<u64>() {
        Ok(ms) => Ok(Duration::from_millis(ms)),
        Err(_) => duration(text),
    }
}

/// A size for people: `512 B`, `1.2 MiB`, `1.0 GiB`.
pub(crate) fn bytes(n: u64) -> String {
    bytesize::ByteSize::b(n).display().iec().to_string()
}

/// How long ago, coarsely: `12s`, `5m`, `3h`, `2d`.
pub(crate) fn ago(elapsed: Duration) -> String {
    let secs = elapsed.as_secs();
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m", secs / 60),
        3600..86_400 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// `n` with thousands separators: `1,234,567`.
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_and_decimal_units() {
        assert_eq!(size("64MiB"), Ok(64 << 20));
        assert_eq!(size("1 GiB"), Ok(1 << 30));
        assert_eq!(size("100KB"), Ok(100_000));
        assert_eq!(size("4096"), Ok(4096));
        assert!(size("lots").unwrap_err().contains("like 64MiB"));
        assert!(memory("64").unwrap_err().contains("at least 64KiB"));
        assert_eq!(memory("64KiB"), Ok(64 << 10));
        assert!(nonzero_size("0B").unwrap_err().contains("at least 1 byte"));
        assert_eq!(nonzero_size("1"), Ok(1));
    }

    #[test]
    fn durations_need_a_unit_except_for_milliseconds_flags() {
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert!(duration("5").unwrap_err().contains("needs a unit"));
        assert!(duration("soon").unwrap_err().contains("not a duration"));
        assert_eq!(millis("50"), Ok(Duration::from_millis(50)));
        assert_eq!(millis("2s"), Ok(Duration::from_secs(2)));
    }

    /// What `--help` shows as a default reads back as that default.
    #[test]
    fn defaults_are_written_as_flags_take_them() {
        for bytes in [16 << 20, 64 << 20, 1 << 30, 1 << 20, 1000, 1536, 1] {
            assert_eq!(size(&size_text(bytes)), Ok(bytes), "{}", size_text(bytes));
        }
        assert_eq!(size_text(16 << 20), "16MiB");
        assert_eq!(size_text(1000), "1000B");
        for duration in [Duration::from_millis(10), Duration::from_millis(500), Duration::from_secs(30)] {
            assert_eq!(self::duration(&duration_text(duration)), Ok(duration));
        }
        assert_eq!(duration_text(Duration::from_millis(100)), "100ms");
        assert_eq!(positive("1024"), Ok(1024));
        assert!(positive("0").unwrap_err().contains("at least 1"));
        assert!(positive("-1").unwrap_err().contains("not a count"));
    }

    #[test]
    fn sizes_and_ages_for_people() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
        assert_eq!(ago(Duration::from_secs(59)), "59s");
        assert_eq!(ago(Duration::from_secs(3 * 3600 + 5)), "3h");
        assert_eq!(ago(Duration::from_secs(9 * 86_400)), "9d");
    }

    #[test]
    fn counts_have_separators() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(1_234_567), "1,234,567");
    }
}
