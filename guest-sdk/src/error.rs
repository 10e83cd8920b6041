//! The typed error of a failed command: [`CommandError`], with its [`ErrorCode`].

use std::fmt;

/// Why a command failed, as the host's providers classify it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// Not granted: a command, a host outside the allow-list, a path outside the
    /// granted directories.
    Denied,
    /// No such command (no provider serves it).
    Unknown,
    /// Malformed input, or something the command cannot act on.
    Invalid,
    /// What the command names does not exist.
    NotFound,
    /// A quota or size limit.
    Limit,
    /// A compare-and-swap lost to another write.
    Conflict,
    /// Not finished in time.
    Timeout,
    /// The service behind the command failed or could not be reached.
    Unavailable,
    /// Any other failure (a handler of the embedder's own, say).
    Other,
}

/// A command's failure, typed: find it in an error chain with
/// `error.downcast_ref::<CommandError>()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandError {
    /// What kind of failure.
    pub code: ErrorCode,
    /// The host's whole error string.
    pub message: String,
}

impl CommandError {
    /// Classifies the host's error string: a provider's `code: message`, the
    /// scheduler's `permission denied: …` and ``unknown command `…` ``, else `Other`.
    pub fn parse(message: String) -> CommandError {
        let code = if message.starts_with("permission denied") {
            ErrorCode::Denied
        } else if message.starts_with("unknown command") {
            ErrorCode::Unknown
        } else {
            match message.split_once(": ").map(|(code, _)| code) {
                Some("denied") => ErrorCode::Denied,
                Some("invalid") => ErrorCode::Invalid,
                Some("not-found") => ErrorCode::NotFound,
                Some("limit") => ErrorCode::Limit,
                Some("conflict") => ErrorCode::Conflict,
                Some("timeout") => ErrorCode::Timeout,
                Some("unavailable") => ErrorCode::Unavailable,
                _ => ErrorCode::Other,
            }
        };
        CommandError { code, message }
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CommandError {}

/// The code of the [`CommandError`] in `error`'s chain, if there is one.
pub fn error_code(error: &anyhow::Error) -> Option<ErrorCode> {
    error.downcast_ref::<CommandError>().map(|e| e.code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_classified_by_their_code() {
        assert_eq!(CommandError::parse("denied: no".into()).code, ErrorCode::Denied);
        assert_eq!(CommandError::parse("permission denied: kv.get".into()).code, ErrorCode::Denied);
        assert_eq!(CommandError::parse("unknown command `x`".into()).code, ErrorCode::Unknown);
        assert_eq!(CommandError::parse("conflict: k is at 3".into()).code, ErrorCode::Conflict);
        assert_eq!(CommandError::parse("the database is down".into()).code, ErrorCode::Other);
    }
}
