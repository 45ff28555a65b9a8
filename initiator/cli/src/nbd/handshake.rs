//! The fixed newstyle handshake: greeting, client flags, then options until NBD_OPT_GO or
//! NBD_OPT_EXPORT_NAME enter transmission (or NBD_OPT_ABORT ends the connection).
//!
//! Options served: NBD_OPT_GO and NBD_OPT_INFO (NBD_INFO_EXPORT always; NBD_INFO_BLOCK_SIZE
//! always, its minimum the block size only when asked for; NBD_INFO_NAME and
//! NBD_INFO_DESCRIPTION when asked for), NBD_OPT_EXPORT_NAME, NBD_OPT_LIST, NBD_OPT_ABORT.
//! Everything else (structured replies, metadata contexts, TLS) is refused with an error reply,
//! after which clients carry on without it.

use std::io::{self, Read, Write};

use zerocopy::{FromBytes as _, IntoBytes as _};

use super::device::Device;
use super::transmit::drain;
use super::wire::{self, ExportGeometry, OptionHeader};

/// What the handshake serves: one export, opened per client when it enters transmission.
pub trait Export {
    /// The export's name; the default export (the empty name) is the same one.
    fn name(&self) -> &str;
    /// A line for NBD_INFO_DESCRIPTION.
    fn description(&self) -> String;
    /// Geometry for NBD_OPT_INFO (NBD_OPT_GO reports the opened device's).
    fn geometry(&self) -> ExportGeometry;
    /// Whether to advertise NBD_FLAG_CAN_MULTI_CONN (several connections share one cache).
    fn multi_conn(&self) -> bool;
    /// Opens the device for a client entering transmission.
    fn open(&self) -> Result<Device, Refusal>;
}

/// Why a client cannot have the export now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Another client has it (NBD_REP_ERR_POLICY).
    Busy(String),
    /// The volume cannot be opened (NBD_REP_ERR_UNKNOWN: not available).
    Unavailable(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Busy(why) | Refusal::Unavailable(why) => f.write_str(why),
        }
    }
}

/// How a handshake ended, when not in error.
#[derive(Debug)]
pub enum Outcome {
    /// Enter transmission with this device.
    Transmit {
        /// The opened device (boxed: it is large, and moves once).
        device: Box<Device>,
        /// The export name the client asked for.
        name: String,
    },
    /// The client sent NBD_OPT_ABORT.
    Aborted,
}

/// Why a handshake failed: the connection is to be dropped.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// Reading or writing failed (the client went away, or was too slow).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The client broke the protocol: bad magic, unknown client flags.
    #[error("protocol violation: {0}")]
    Violation(String),
    /// NBD_OPT_EXPORT_NAME for an export that cannot be had: it has no error reply.
    #[error("{0}")]
    Refused(String),
}

/// Runs the handshake on a fresh connection.
pub fn handshake<E: Export>(r: &mut impl Read, w: &mut impl Write, export: &E) -> Result<Outcome, HandshakeError> {
    w.write_all(wire::greeting().as_bytes())?;
    w.flush()?;
    let mut flags = [0u8; 4];
    r.read_exact(&mut flags)?;
    let flags = u32::from_be_bytes(flags);
    let known = wire::FLAG_C_FIXED_NEWSTYLE | wire::FLAG_C_NO_ZEROES;
    if flags & !known != 0 {
        return Err(HandshakeError::Violation(format!("unknown client flags {flags:#x}")));
    }
    // Fixed newstyle is honoured even for clients that do not set its bit (the spec allows it).
    let no_zeroes = flags & wire::FLAG_C_NO_ZEROES != 0;
    loop {
        let mut raw = [0u8; size_of::<OptionHeader>()];
        r.read_exact(&mut raw)?;
        let hdr = OptionHeader::read_from_bytes(&raw).map_err(|_| HandshakeError::Violation("short option".into()))?;
        if hdr.magic.get() != wire::IHAVEOPT {
            return Err(HandshakeError::Violation(format!("bad option magic {:#018x}", hdr.magic.get())));
        }
        let (opt, len) = (hdr.option.get(), hdr.len.get());
        if len > wire::MAX_OPTION_LEN {
            drain(r, len.into())?;
            error_reply(w, opt, wire::REP_ERR_TOO_BIG, &format!("option data of {len} bytes is too long"))?;
            continue;
        }
        let mut data = vec![0; len as usize];
        r.read_exact(&mut data)?;
        match opt {
            wire::OPT_EXPORT_NAME => {
                let name = String::from_utf8(data)
                    .map_err(|_| HandshakeError::Violation("export name is not UTF-8".into()))?;
                if !knows(export, &name) {
                    return Err(HandshakeError::Refused(format!("unknown export {name:?} (NBD_OPT_EXPORT_NAME)")));
                }
                let device = export.open().map_err(|e| HandshakeError::Refused(e.to_string()))?;
                let geo = device.geometry();
                let reply = wire::ExportNameReply {
                    size: geo.size.into(),
                    flags: geo.transmission_flags(export.multi_conn()).into(),
                };
                w.write_all(reply.as_bytes())?;
                if !no_zeroes {
                    w.write_all(&[0; wire::EXPORT_NAME_PAD])?;
                }
                w.flush()?;
                return Ok(Outcome::Transmit { device: Box::new(device), name });
            }
            wire::OPT_ABORT => {
                // The client may already be gone: it need not wait for the ACK.
                let _ = reply(w, opt, wire::REP_ACK, &[]).and_then(|()| w.flush());
                return Ok(Outcome::Aborted);
            }
            wire::OPT_LIST if !data.is_empty() => {
                error_reply(w, opt, wire::REP_ERR_INVALID, "NBD_OPT_LIST takes no data")?;
            }
            wire::OPT_LIST => {
                let name = export.name().as_bytes();
                let mut server = (name.len() as u32).to_be_bytes().to_vec();
                server.extend_from_slice(name);
                reply(w, opt, wire::REP_SERVER, &server)?;
                reply(w, opt, wire::REP_ACK, &[])?;
            }
            wire::OPT_INFO | wire::OPT_GO => {
                if let Some(device) = info_or_go(w, opt, &data, export)? {
                    w.flush()?;
                    let name = wire::parse_info_request(&data).map(|r| r.name).unwrap_or_default();
                    return Ok(Outcome::Transmit { device: Box::new(device), name });
                }
            }
            wire::OPT_STARTTLS => error_reply(w, opt, wire::REP_ERR_POLICY, "TLS is not supported")?,
            _ => error_reply(w, opt, wire::REP_ERR_UNSUP, &format!("option {opt} is not supported"))?,
        }
        w.flush()?;
    }
}

/// The export's name or the default export's.
fn knows<E: Export>(export: &E, name: &str) -> bool {
    name.is_empty() || name == export.name()
}

/// Answers NBD_OPT_INFO, or NBD_OPT_GO with the device to enter transmission with.
fn info_or_go<E: Export>(
    w: &mut impl Write,
    opt: u32,
    data: &[u8],
    export: &E,
) -> Result<Option<Device>, HandshakeError> {
    let Some(req) = wire::parse_info_request(data) else {
        error_reply(w, opt, wire::REP_ERR_INVALID, "malformed NBD_OPT_INFO/NBD_OPT_GO data")?;
        return Ok(None);
    };
    if !knows(export, &req.name) {
        let text = format!(
            "no export named {:?}: this server exports {:?} (also as the default export)",
            req.name,
            export.name()
        );
        error_reply(w, opt, wire::REP_ERR_UNKNOWN, &text)?;
        return Ok(None);
    }
    let (device, geo) = if opt == wire::OPT_GO {
        match export.open() {
            Ok(device) => {
                let geo = device.geometry();
                (Some(device), geo)
            }
            Err(Refusal::Busy(text)) => {
                error_reply(w, opt, wire::REP_ERR_POLICY, &text)?;
                return Ok(None);
            }
            Err(Refusal::Unavailable(text)) => {
                error_reply(w, opt, wire::REP_ERR_UNKNOWN, &text)?;
                return Ok(None);
            }
        }
    } else {
        (None, export.geometry())
    };
    let info = wire::InfoExport {
        info: wire::INFO_EXPORT.into(),
        size: geo.size.into(),
        flags: geo.transmission_flags(export.multi_conn()).into(),
    };
    reply(w, opt, wire::REP_INFO, info.as_bytes())?;
    let block_sizes = geo.block_size_info(req.infos.contains(&wire::INFO_BLOCK_SIZE));
    reply(w, opt, wire::REP_INFO, block_sizes.as_bytes())?;
    if req.infos.contains(&wire::INFO_NAME) {
        reply(w, opt, wire::REP_INFO, &[&wire::INFO_NAME.to_be_bytes(), export.name().as_bytes()].concat())?;
    }
    if req.infos.contains(&wire::INFO_DESCRIPTION) {
        let text = export.description();
        reply(w, opt, wire::REP_INFO, &[&wire::INFO_DESCRIPTION.to_be_bytes(), text.as_bytes()].concat())?;
    }
    reply(w, opt, wire::REP_ACK, &[])?;
    Ok(device)
}

fn reply(w: &mut impl Write, opt: u32, kind: u32, data: &[u8]) -> io::Result<()> {
    w.write_all(wire::option_reply(opt, kind, data.len()).as_bytes())?;
    w.write_all(data)
}

/// An error reply with a message for the user (NBD strings are at most 4096 bytes).
fn error_reply(w: &mut impl Write, opt: u32, kind: u32, text: &str) -> io::Result<()> {
    let mut end = text.len().min(4096);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    tracing::debug!(option = opt, reply = kind, text, "option refused");
    reply(w, opt, kind, &text.as_bytes()[..end])
}
