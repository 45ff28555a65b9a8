//! The bench's error type.

/// Result alias for the bench.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can stop a run. Verification mismatches are not errors: they are counted in
/// the [`Report`](crate::Report), which the caller turns into a failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A bad argument, refused before any I/O (the text names the flag and the limit).
    #[error("{0}")]
    Invalid(String),
    /// Connecting, opening, a queue or the control channel failed.
    #[error("{what}")]
    Initiator {
        /// What the bench was doing.
        what: String,
        /// The initiator's error.
        #[source]
        source: Box<rblk_initiator::Error>,
    },
    /// An I/O of a job failed (a failed completion, a lost connection, a timeout).
    #[error("job {job}: {what}")]
    Job {
        /// The job (0-based).
        job: u32,
        /// What it was doing.
        what: String,
        /// The initiator's error.
        #[source]
        source: Box<rblk_initiator::Error>,
    },
    /// A `--log` file could not be created or written.
    #[error("{what} the log {}: {source}", path.display())]
    Log {
        /// "creating" or "writing".
        what: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A file of the command line (a job file, `--output`, `--json`) could not be read, created
    /// or written.
    #[error("{what} {}", path.display())]
    File {
        /// "reading", "creating" or "writing".
        what: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A job file that does not parse, or that asks for something rblk-bench does not do.
    #[error("{}, line {line}: {what}", path.display())]
    JobFile {
        /// The file.
        path: std::path::PathBuf,
        /// Its line (from 1).
        line: usize,
        /// What is wrong, naming the option.
        what: String,
    },
    /// A job section of a job file failed.
    #[error("job {name:?}")]
    Section {
        /// The section's name.
        name: String,
        /// Why.
        #[source]
        source: Box<Error>,
    },
    /// A job's thread panicked (a bug in the bench).
    #[error("job {job} panicked")]
    Panicked {
        /// The job (0-based).
        job: u32,
    },
}

impl Error {
    pub(crate) fn initiator(what: impl Into<String>) -> impl FnOnce(rblk_initiator::Error) -> Error {
        let what = what.into();
        move |source| Error::Initiator { what, source: Box::new(source) }
    }
}
