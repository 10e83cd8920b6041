//! [`ErrorCode`], what kind of failure a command met, and how it is written in the
//! command's error string.

use core::fmt;

/// What kind of failure a command met.
///
/// A provider's failure is the string `"<code>: <message>"`, its code one of the names
/// [`ErrorCode::as_str`] gives, so that a guest tells a missing grant from a full quota
/// without parsing prose; [`ErrorCode::of`] reads it back from any command's error
/// string, the scheduler's own included.
///
/// ```
/// use wasmproc_types::ErrorCode;
///
/// assert_eq!(ErrorCode::NotFound.as_str(), "not-found");
/// assert_eq!(ErrorCode::of("not-found: no key `k`"), ErrorCode::NotFound);
/// assert_eq!(ErrorCode::of("permission denied: `kv.get`"), ErrorCode::Denied);
/// assert_eq!(ErrorCode::of("the database is down"), ErrorCode::Other);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// Not granted: a command, a host outside the allow-list, a path outside the granted
    /// directories.
    Denied,
    /// No such command: nothing serves it.
    Unknown,
    /// Malformed input, or something the command cannot act on.
    Invalid,
    /// What the command names does not exist.
    NotFound,
    /// A quota or a size limit would be passed.
    Limit,
    /// A compare-and-swap found another version.
    Conflict,
    /// The command did not finish in time.
    Timeout,
    /// The service behind the command failed or could not be reached.
    Unavailable,
    /// Any other failure: an error string with no code (a handler of an embedder's own).
    Other,
}

impl ErrorCode {
    /// Every code, in declaration order.
    pub const ALL: [ErrorCode; 9] = [
        ErrorCode::Denied,
        ErrorCode::Unknown,
        ErrorCode::Invalid,
        ErrorCode::NotFound,
        ErrorCode::Limit,
        ErrorCode::Conflict,
        ErrorCode::Timeout,
        ErrorCode::Unavailable,
        ErrorCode::Other,
    ];

    /// The code's name, as the first word of an error string.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Denied => "denied",
            ErrorCode::Unknown => "unknown",
            ErrorCode::Invalid => "invalid",
            ErrorCode::NotFound => "not-found",
            ErrorCode::Limit => "limit",
            ErrorCode::Conflict => "conflict",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Other => "other",
        }
    }

    /// The code named `name` ([`ErrorCode::as_str`]), if any.
    pub fn from_name(name: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|code| code.as_str() == name)
    }

    /// Classifies a command's error string: a provider's `"<code>: <message>"`; the
    /// scheduler's `permission denied: …` (denied), ``unknown command `…` `` (unknown)
    /// and `process limit reached: …` (limit); anything else is [`ErrorCode::Other`].
    pub fn of(error: &str) -> ErrorCode {
        if error.starts_with("permission denied") {
            return ErrorCode::Denied;
        }
        if error.starts_with("unknown command") {
            return ErrorCode::Unknown;
        }
        if error.starts_with("process limit reached") {
            return ErrorCode::Limit;
        }
        error.split_once(": ").and_then(|(code, _)| ErrorCode::from_name(code)).unwrap_or(ErrorCode::Other)
    }
}

/// The code's name: [`ErrorCode::as_str`].
impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use alloc::format;

    use super::*;

    #[test]
    fn every_code_reads_back_from_its_error_string() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_name(code.as_str()), Some(code));
            assert_eq!(ErrorCode::of(&format!("{code}: what went wrong")), code);
        }
        assert_eq!(ErrorCode::from_name("Denied"), None);
    }

    /// The names on the wire, which guests already match on.
    #[test]
    fn the_provider_codes_keep_their_names() {
        let names = ErrorCode::ALL.map(ErrorCode::as_str);
        assert_eq!(
            names,
            ["denied", "unknown", "invalid", "not-found", "limit", "conflict", "timeout", "unavailable", "other"]
        );
    }

    #[test]
    fn the_schedulers_errors_are_classified() {
        assert_eq!(ErrorCode::of("permission denied: kv.get"), ErrorCode::Denied);
        assert_eq!(ErrorCode::of("unknown command `x`"), ErrorCode::Unknown);
        assert_eq!(ErrorCode::of("process limit reached: 10 processes are running"), ErrorCode::Limit);
        assert_eq!(ErrorCode::of("the database is down"), ErrorCode::Other);
        assert_eq!(ErrorCode::of("nonsense: the database is down"), ErrorCode::Other);
    }
}
