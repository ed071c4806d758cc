//! Why a handler failed: `Error` (a failure, retried; a permanent one, Dead at once; any other
//! `std::error::Error` through `?`, as `<Type>: <message>`).
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The message is the error (an `OperatorFailure`).
    Failure,
    /// Fail the task for good.
    Permanent,
    /// Any other error: `<Type>: <message>`.
    Other,
}

/// Why a handler failed. `?` converts any `std::error::Error` into one.
pub struct Error {
    kind: Kind,
    message: String,
}

impl Error {
    /// Fail the task with this message (an `OperatorFailure`).
    pub fn failure(message: impl Into<String>) -> Error {
        Error { kind: Kind::Failure, message: message.into() }
    }

    /// Fail the task for good: no retry, the task is Dead at once.
    pub fn permanent(message: impl Into<String>) -> Error {
        Error { kind: Kind::Permanent, message: message.into() }
    }

    /// Any other error, as `<kind>: <message>` (the other runtimes' exception name and message).
    pub(crate) fn other(kind: &str, message: impl fmt::Display) -> Error {
        Error { kind: Kind::Other, message: format!("{}: {}", kind, message) }
    }

    pub fn is_permanent(&self) -> bool {
        self.kind == Kind::Permanent
    }

    /// The error of the failed task.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error({:?}, {:?})", self.kind, self.message)
    }
}

impl<E: std::error::Error> From<E> for Error {
    fn from(error: E) -> Error {
        let name = std::any::type_name::<E>();
        let short = name.split('<').next().unwrap_or(name).rsplit("::").next().unwrap_or(name);
        Error { kind: Kind::Other, message: format!("{}: {}", short, error) }
    }
}

/// Return `Err(PermanentFailure(..).into())` to fail the task for good.
#[derive(Debug, Clone)]
pub struct PermanentFailure(pub String);

impl From<PermanentFailure> for Error {
    fn from(failure: PermanentFailure) -> Error {
        Error::permanent(failure.0)
    }
}

impl Error {
    /// A converted `std::error::Error` (its message is worth a line on stderr).
    pub(crate) fn is_other(&self) -> bool {
        self.kind == Kind::Other
    }
}
