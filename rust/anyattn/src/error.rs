//! The error type: a status code and the C library's message.

use std::ffi::CStr;
use std::fmt;

use anyattn_sys as sys;

/// Why a call failed; mirrors the C ABI's `anyattn_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// A parameter is malformed: wrong shape, dtype, stride, range, or a view that does not fit
    /// its slice.
    InvalidArgument,
    /// The request is well formed but names a feature this build or CPU does not provide.
    Unsupported,
    /// Workspace could not be allocated. Nothing was written to the outputs.
    OutOfMemory,
    /// A bug in anyattn.
    Internal,
    /// A status code these bindings do not know (a newer library); the raw value.
    Unknown(i32),
}

impl Status {
    pub(crate) fn from_raw(raw: sys::anyattn_status) -> Option<Status> {
        match raw {
            sys::ANYATTN_OK => None,
            sys::ANYATTN_E_INVALID_ARGUMENT => Some(Status::InvalidArgument),
            sys::ANYATTN_E_UNSUPPORTED => Some(Status::Unsupported),
            sys::ANYATTN_E_OUT_OF_MEMORY => Some(Status::OutOfMemory),
            sys::ANYATTN_E_INTERNAL => Some(Status::Internal),
            other => Some(Status::Unknown(other)),
        }
    }

    /// The C name of the status, e.g. `"ANYATTN_E_INVALID_ARGUMENT"`.
    pub fn name(self) -> &'static str {
        match self {
            Status::InvalidArgument => "ANYATTN_E_INVALID_ARGUMENT",
            Status::Unsupported => "ANYATTN_E_UNSUPPORTED",
            Status::OutOfMemory => "ANYATTN_E_OUT_OF_MEMORY",
            Status::Internal => "ANYATTN_E_INTERNAL",
            Status::Unknown(_) => "ANYATTN_E_UNKNOWN",
        }
    }
}

/// A failed anyattn call: the status and a message that names the offending parameter, the value
/// given and what is supported.
///
/// Errors detected by the C library carry its `anyattn_last_error()` message verbatim. Errors this
/// crate detects before calling it (a view that does not fit its slice, a value the C ABI cannot
/// represent) carry a message written in the same style.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    /// An error with the given status and message.
    pub(crate) fn new(status: Status, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
        }
    }

    /// An `InvalidArgument` error with the given message.
    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(Status::InvalidArgument, message)
    }

    /// The status code.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The message, without the status name.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for Error {}

/// The result type of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Turns a C status into a `Result`, reading the thread-local message on failure. Must be called
/// on the thread that made the C call, before any other anyattn call.
pub(crate) fn check(raw: sys::anyattn_status) -> Result<()> {
    match Status::from_raw(raw) {
        None => Ok(()),
        Some(status) => {
            // SAFETY: anyattn_last_error returns a valid NUL-terminated string that lives until
            // the next anyattn call on this thread; it is copied out at once.
            let message = unsafe { CStr::from_ptr(sys::anyattn_last_error()) }
                .to_string_lossy()
                .into_owned();
            Err(Error::new(status, message))
        }
    }
}
