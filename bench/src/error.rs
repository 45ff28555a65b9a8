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
    /// One option's value refused before any I/O: `text` names it as a flag (`--iodepth must
    /// be ...`); in a job file the error names the option's line instead.
    #[error("{text}")]
    Value {
        /// The option, by fio's name (`iodepth`, `numjobs`, `bs`).
        option: &'static str,
        /// What is wrong and what is wanted.
        text: String,
    },
    /// Connecting to the target (or reading its key file) failed: the initiator's error as
    /// `rblk` reports it (it names the address, or the file).
    #[error(transparent)]
    Connect(Box<rblk_initiator::Error>),
    /// Opening, a queue or the control channel failed.
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
    #[error("{}:{line}: {what}", path.display())]
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
    /// The process's exit status for this error: 2 for what the command line or the job file
    /// asks wrongly (as clap and `rblk` exit on a usage error), 1 for a run that failed.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Invalid(_) | Error::Value { .. } | Error::JobFile { .. } => 2,
            Error::Section { source, .. } => source.exit_code(),
            _ => 1,
        }
    }

    /// True when rdma_cm found no RDMA device for the address (ENODEV in the chain), where
    /// `rblk` adds what to do about it.
    pub fn no_device(&self) -> bool {
        let mut e: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(c) = e {
            if c.downcast_ref::<std::io::Error>().and_then(std::io::Error::raw_os_error) == Some(nix::libc::ENODEV) {
                return true;
            }
            e = c.source();
        }
        false
    }

    pub(crate) fn initiator(what: impl Into<String>) -> impl FnOnce(rblk_initiator::Error) -> Error {
        let what = what.into();
        move |source| Error::Initiator { what, source: Box::new(source) }
    }
}
