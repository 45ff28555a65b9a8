//! The admin socket's protocol, which the daemon ([`crate::admin`]) and its clients
//! (`rblk-target admin ...`, a successor taking the volumes over) share: the requests and
//! replies, the peer check both ends make, and the client.
//!
//! Protocol: one JSON object per line each way, [`VERSION`] in every request and reply.
//!
//! ```text
//! {"version":1,"op":"list"}
//! {"version":1,"op":"add","volume":{"name":"v1","size":"64M","path":"/srv/v1.img","allow":{"db1":"rw"}}}
//! {"version":1,"op":"remove","name":"v1"}
//! {"version":1,"op":"access"}
//! -> {"version":1,"ok":true,"message":"...","volumes":[{"name":..,"size":..,"sessions":..,"state":..},..]}
//! -> {"version":1,"ok":false,"error":"busy","message":"volume v1 has 1 open session(s): ..."}
//! ```

use std::io::{BufRead, BufReader, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::FileVolume;
use crate::errors::ClientError;

/// The protocol version, in every request and reply.
pub const VERSION: u64 = 1;
/// Where `rblk-target` serves its admin socket unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/rblk-target/admin.sock";
/// The longest request line, in bytes.
pub const MAX_LINE: usize = 64 << 10;
/// How long a connection may stay silent.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// Every volume served, with its sessions and state.
    List,
    /// Serve a new volume.
    Add {
        /// As a `[[volume]]` of the config file.
        volume: FileVolume,
    },
    /// Stop serving a volume nobody has open.
    Remove {
        /// Its name.
        name: String,
    },
    /// Change the size of a volume added with `add`: grow it while it is served, or make it
    /// again smaller while nobody has it open (see [`crate::reload`]'s rules).
    Resize {
        /// Its name.
        name: String,
        /// The new size in bytes.
        size: u64,
    },
    /// Hand every volume to the service manager's file descriptor store and exit, for systemd
    /// to start the successor with them (see [`crate::handover`]).
    Handover {
        /// The volumes the successor's checks passed ([`crate::handover::preflight`]): the
        /// daemon refuses if it serves others now (one was added or removed meanwhile).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expect: Option<Vec<Expected>>,
    },
    /// Who may get in and open what, keys by fingerprint only (`--check-config` compares a
    /// file with it: see [`crate::access_changes`]).
    Access,
    /// From a successor (`rblk-target --takeover`): hand every volume to it over this
    /// connection (see [`crate::handover`]); the state formats it reads.
    Takeover {
        /// State formats the successor reads.
        formats: Vec<u32>,
    },
}

/// A volume as the successor's checks saw it (see [`Request::Handover`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expected {
    /// Name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Backing store of a durable volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
}

/// One volume in a list reply.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeInfo {
    /// Name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Backing store of a durable volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Sessions that have it open.
    pub sessions: usize,
    /// `ok`, `failed` (a write-back failed: read-only now) or `refused` (could not be loaded).
    pub state: String,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// In the configuration applied last; false for one a reload removed while it was open
    /// (it goes once idle, at the next reload).
    pub configured: bool,
}

/// A reply.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reply {
    /// [`VERSION`].
    pub version: u64,
    /// Whether the request was carried out.
    pub ok: bool,
    /// Why not ([`AdminError::code`](crate::admin::AdminError::code)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What was done, or why not.
    pub message: String,
    /// The volumes, for a list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<VolumeInfo>>,
    /// The access policy, for `access`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<crate::access_changes::Access>,
}

/// Whether the process at the other end of `stream` may be trusted with the admin socket:
/// root or this process's own user (`SO_PEERCRED`, as the kernel recorded it at connect).
/// `Err` names the peer's uid.
pub fn check_peer(stream: &UnixStream) -> Result<(), String> {
    let creds = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| format!("cannot read the peer's credentials: {e}"))?;
    peer_allowed(creds.uid(), nix::unistd::geteuid().as_raw())
}

fn peer_allowed(peer: u32, me: u32) -> Result<(), String> {
    if peer == 0 || peer == me {
        Ok(())
    } else {
        Err(format!("uid {peer} is neither root nor the daemon's user (uid {me})"))
    }
}

fn client_error(path: &Path, source: std::io::Error) -> ClientError {
    match source.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            ClientError::NotRunning(path.to_owned())
        }
        std::io::ErrorKind::PermissionDenied => ClientError::PermissionDenied(path.to_owned()),
        _ => ClientError::Io { path: path.to_owned(), source },
    }
}

/// Connects to the admin socket at `path`.
pub fn connect(path: &Path) -> Result<UnixStream, ClientError> {
    let stream = UnixStream::connect(path).map_err(|e| client_error(path, e))?;
    check_peer(&stream).map_err(|why| ClientError::UntrustedServer(path.to_owned(), why))?;
    Ok(stream)
}

/// Sends `request` to the admin socket at `path` and returns the daemon's reply if it carried
/// the request out.
pub fn request(path: &Path, request: &Request) -> Result<Reply, ClientError> {
    request_on(connect(path)?, path, request)
}

/// [`request`] on a connection made with [`connect`] to `path`.
pub fn request_on(stream: UnixStream, path: &Path, request: &Request) -> Result<Reply, ClientError> {
    let mut value = serde_json::to_value(request).map_err(|e| ClientError::BadReply(path.to_owned(), e.to_string()))?;
    if let serde_json::Value::Object(map) = &mut value {
        map.insert("version".into(), VERSION.into());
    }
    let reply = line_on(stream, path, value.to_string().as_bytes())?;
    let reply: Reply =
        serde_json::from_str(&reply).map_err(|e| ClientError::BadReply(path.to_owned(), e.to_string()))?;
    if reply.ok {
        Ok(reply)
    } else {
        Err(ClientError::Refused { code: reply.error.unwrap_or_default(), message: reply.message })
    }
}

/// Sends one raw line (a newline is added) and returns the reply line (tests send bad ones).
pub fn request_line(path: &Path, line: &[u8]) -> Result<String, ClientError> {
    line_on(connect(path)?, path, line)
}

fn line_on(mut stream: UnixStream, path: &Path, line: &[u8]) -> Result<String, ClientError> {
    let io = |source| client_error(path, source);
    // A durable volume's load can take minutes.
    stream.set_read_timeout(None).map_err(io)?;
    let mut text = line.to_vec();
    text.push(b'\n');
    // A daemon that refuses the connection (see `accept`) may answer and close before the
    // request is written: its answer says why, better than the broken pipe.
    let wrote = stream.write_all(&text);
    let mut reply = String::new();
    let read = BufReader::new(stream).read_line(&mut reply);
    if reply.is_empty() {
        wrote.map_err(io)?;
        read.map_err(io)?;
        return Err(ClientError::BadReply(path.to_owned(), "the daemon closed the connection".into()));
    }
    Ok(reply)
}
