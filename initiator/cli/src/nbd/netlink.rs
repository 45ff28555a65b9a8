//! The kernel's NBD driver through its generic netlink family `nbd` (`linux/nbd-netlink.h`), as
//! nbd-client does after its own handshake: NBD_CMD_CONNECT hands the driver a connected socket
//! with the export's size, block size and transmission flags, and answers with the device's index;
//! NBD_CMD_RECONFIGURE with a new NBD_ATTR_SIZE_BYTES resizes a connected device (mainline since
//! 5.3); NBD_CMD_DISCONNECT sends NBD_CMD_DISC on the device's sockets and shuts them down.
//!
//! The messages are built by [`connect_message`], [`resize_message`] and [`disconnect_message`]
//! (checked byte for byte against the header's layout in the tests); [`Driver`] sends them and
//! turns the driver's errnos into words ([`DriverError`]).

use std::os::fd::RawFd;

use neli::consts::nl::NlmF;
use neli::consts::socket::NlFamily;
use neli::err::RouterError;
use neli::genl::{AttrTypeBuilder, Genlmsghdr, GenlmsghdrBuilder, Nlattr, NlattrBuilder};
use neli::nl::NlPayload;
use neli::router::synchronous::NlRouter;
use neli::types::{Buffer, GenlBuffer};
use neli::utils::Groups;
use neli::{neli_enum, ToBytes};

/// NBD_GENL_FAMILY_NAME.
pub const FAMILY: &str = "nbd";
/// NBD_GENL_VERSION.
const VERSION: u8 = 1;

/// The family's commands (`NBD_CMD_*` of nbd-netlink.h, not the wire protocol's).
#[neli_enum(serialized_type = "u8")]
pub enum Cmd {
    Unspec = 0,
    Connect = 1,
    Disconnect = 2,
    Reconfigure = 3,
    LinkDead = 4,
    Status = 5,
}
impl neli::consts::genl::Cmd for Cmd {}

/// `NBD_ATTR_*`: the configuration attributes. The driver's policy: INDEX is a u32, the sizes,
/// timeouts and flags are u64, SOCKETS is nested.
#[neli_enum(serialized_type = "u16")]
pub enum Attr {
    Unspec = 0,
    Index = 1,
    SizeBytes = 2,
    BlockSizeBytes = 3,
    Timeout = 4,
    ServerFlags = 5,
    ClientFlags = 6,
    Sockets = 7,
    DeadConnTimeout = 8,
    DeviceList = 9,
    BackendIdentifier = 10,
}
impl neli::consts::genl::NlAttrType for Attr {}

/// `NBD_SOCK_ITEM`: one socket inside NBD_ATTR_SOCKETS.
#[neli_enum(serialized_type = "u16")]
pub enum SockItem {
    Unspec = 0,
    Item = 1,
}
impl neli::consts::genl::NlAttrType for SockItem {}

/// `NBD_SOCK_FD`: the socket's file descriptor (u32) inside an NBD_SOCK_ITEM.
#[neli_enum(serialized_type = "u16")]
pub enum Sock {
    Unspec = 0,
    Fd = 1,
}
impl neli::consts::genl::NlAttrType for Sock {}

/// A generic netlink message of the family.
pub type Message = Genlmsghdr<Cmd, Attr>;

/// Which device: `/dev/nbdN`, or the first free one (the driver picks, or adds one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Index {
    /// `/dev/nbdN`.
    Dev(u32),
    /// `auto`: NBD_ATTR_INDEX left out.
    Any,
}

impl Index {
    /// Device numbers fit the block layer's 20 minor bits.
    pub const LIMIT: u32 = 1 << 20;

    /// Parses `--nbd-device`: `/dev/nbdN` or `auto`.
    pub fn parse(text: &str) -> Result<Index, String> {
        if text == "auto" {
            return Ok(Index::Any);
        }
        let wanted = || format!("{text:?}: expected /dev/nbdN (N a number below {}) or auto", Index::LIMIT);
        let n = text.strip_prefix("/dev/nbd").ok_or_else(wanted)?;
        // Digits only: no sign, no spaces, no partitions (nbd0p1).
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || (n.len() > 1 && n.starts_with('0')) {
            return Err(wanted());
        }
        match n.parse::<u32>() {
            Ok(i) if i < Index::LIMIT => Ok(Index::Dev(i)),
            _ => Err(wanted()),
        }
    }
}

/// The device's path.
pub fn device_path(index: u32) -> String {
    format!("/dev/nbd{index}")
}

/// What NBD_CMD_CONNECT tells the driver besides the sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connect {
    /// Which device.
    pub index: Index,
    /// The export's size in bytes.
    pub size: u64,
    /// The device's logical block size (a power of two from 512 to the page size).
    pub block_size: u64,
    /// The transmission flags, as a server sends them in its handshake (`NBD_FLAG_*`).
    pub server_flags: u64,
}

fn attr<T: neli::consts::genl::NlAttrType, P: neli::Size + ToBytes>(kind: T, payload: P) -> Nlattr<T, Buffer> {
    let kind = AttrTypeBuilder::default().nla_type(kind).build().expect("an attribute type has every field");
    NlattrBuilder::default().nla_type(kind).nla_payload(payload).build().expect("an attribute has every field")
}

fn message(cmd: Cmd, attrs: Vec<Nlattr<Attr, Buffer>>) -> Message {
    GenlmsghdrBuilder::default()
        .cmd(cmd)
        .version(VERSION)
        .attrs(attrs.into_iter().collect::<GenlBuffer<_, _>>())
        .build()
        .expect("a generic netlink header has every field")
}

/// NBD_CMD_CONNECT: INDEX (unless any device will do), SIZE_BYTES, BLOCK_SIZE_BYTES,
/// SERVER_FLAGS, and SOCKETS with one NBD_SOCK_ITEM holding an NBD_SOCK_FD per connected socket
/// the driver is to send requests on (the driver takes its own reference to each).
pub fn connect_message(c: &Connect, sockets: &[RawFd]) -> Message {
    let mut attrs = Vec::new();
    if let Index::Dev(i) = c.index {
        attrs.push(attr(Attr::Index, i));
    }
    attrs.push(attr(Attr::SizeBytes, c.size));
    attrs.push(attr(Attr::BlockSizeBytes, c.block_size));
    attrs.push(attr(Attr::ServerFlags, c.server_flags));
    let mut list = attr(Attr::Sockets, Buffer::new());
    for &fd in sockets {
        // A descriptor is never negative; the driver reads it back as an int.
        let item =
            attr(SockItem::Item, Buffer::new()).nest(&attr(Sock::Fd, fd as u32)).expect("a u32 attribute serializes");
        list = list.nest(&item).expect("a nested attribute serializes");
    }
    attrs.push(list);
    message(Cmd::Connect, attrs)
}

/// NBD_CMD_RECONFIGURE with INDEX and SIZE_BYTES: the device's new size.
pub fn resize_message(index: u32, size: u64) -> Message {
    message(Cmd::Reconfigure, vec![attr(Attr::Index, index), attr(Attr::SizeBytes, size)])
}

/// NBD_CMD_DISCONNECT with INDEX.
pub fn disconnect_message(index: u32) -> Message {
    message(Cmd::Disconnect, vec![attr(Attr::Index, index)])
}

/// The driver's index in NBD_CMD_CONNECT's reply.
pub fn reply_index(reply: &Message) -> Option<u32> {
    reply.attrs().get_attr_handle().get_attr_payload_as::<u32>(Attr::Index).ok()
}

/// What went wrong talking to the driver, in words.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum DriverError {
    /// The family is not registered: the module is not loaded.
    #[error("the nbd driver is not loaded (modprobe nbd)")]
    NotLoaded,
    /// EPERM: the driver wants CAP_SYS_ADMIN.
    #[error("{what}: the nbd driver allows this to root only (CAP_SYS_ADMIN)")]
    NotPermitted {
        /// What was being done, e.g. "connecting /dev/nbd0".
        what: String,
    },
    /// EBUSY at connect: another client holds the device.
    #[error("{device} is in use{holder}: pick another device, or --nbd-device auto")]
    InUse {
        /// The device.
        device: String,
        /// Who connected it (/sys/block/nbdN/pid), and how to free it when that process is gone
        /// (killed, or nbd-client, which exits once the kernel has the socket), or nothing.
        holder: String,
    },
    /// Another errno from the driver.
    #[error("{what}: the nbd driver refused ({reason}; the kernel log says why: dmesg)")]
    Refused {
        /// What was being done.
        what: String,
        /// The errno in words.
        reason: String,
    },
    /// The driver's reply to a connect had no index.
    #[error("{what}: the nbd driver's reply named no device")]
    NoIndex {
        /// What was being done.
        what: String,
    },
    /// The netlink socket itself failed.
    #[error("{what}: talking to the kernel over netlink failed ({reason})")]
    Netlink {
        /// What was being done.
        what: String,
        /// Why.
        reason: String,
    },
}

/// Which request an errno answered, for [`DriverError::from_errno`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Looking the family up.
    Family,
    /// NBD_CMD_CONNECT.
    Connect(Index),
    /// NBD_CMD_RECONFIGURE for a new size.
    Resize(u32, u64),
    /// NBD_CMD_DISCONNECT.
    Disconnect(u32),
}

impl Request {
    fn what(self) -> String {
        match self {
            Request::Family => "finding the nbd driver".into(),
            Request::Connect(Index::Dev(i)) => format!("connecting {}", device_path(i)),
            Request::Connect(Index::Any) => "connecting a free /dev/nbdN".into(),
            Request::Resize(i, size) => format!("resizing {} to {}", device_path(i), crate::common::human(size)),
            Request::Disconnect(i) => format!("disconnecting {}", device_path(i)),
        }
    }
}

impl DriverError {
    /// The driver's (or the controller's) errno, positive, in words. `holder` says who connected
    /// a busy device, and whether that process still runs.
    pub fn from_errno(req: Request, errno: i32, holder: impl FnOnce(u32) -> Option<(u32, bool)>) -> DriverError {
        match (req, errno) {
            // The generic netlink controller knows no family of that name.
            (Request::Family, libc::ENOENT) => DriverError::NotLoaded,
            (_, libc::EPERM | libc::EACCES) => DriverError::NotPermitted { what: req.what() },
            (Request::Connect(Index::Dev(i)), libc::EBUSY) => DriverError::InUse {
                device: device_path(i),
                holder: match holder(i) {
                    Some((pid, true)) => format!(" (connected by pid {pid})"),
                    Some((pid, false)) => format!(
                        " (connected by pid {pid}, which has exited; `nbd-client -d {}` disconnects it)",
                        device_path(i)
                    ),
                    None => String::new(),
                },
            },
            _ => DriverError::Refused { what: req.what(), reason: errno_words(errno) },
        }
    }
}

/// An errno as words (its description, as `rblk`'s errors show an OS error), lower case.
fn errno_words(errno: i32) -> String {
    let text = nix::errno::Errno::from_raw(errno).desc();
    let mut chars = text.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => format!("errno {errno}"),
    }
}

/// Who connected /dev/nbdN (the pid the driver shows in sysfs while the device is connected), and
/// whether that process still runs.
pub fn holder(index: u32) -> Option<(u32, bool)> {
    let pid: u32 = std::fs::read_to_string(format!("/sys/block/nbd{index}/pid")).ok()?.trim().parse().ok()?;
    Some((pid, std::path::Path::new(&format!("/proc/{pid}")).exists()))
}

/// A netlink socket to the driver.
pub struct Driver {
    router: NlRouter,
    family: u16,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("family", &self.family).finish_non_exhaustive()
    }
}

/// A neli error as a [`DriverError`].
fn router_error<T, P>(req: Request, e: RouterError<T, P>) -> DriverError {
    match e {
        RouterError::Nlmsgerr(msg) => DriverError::from_errno(req, -*msg.error(), holder),
        RouterError::Io(kind) => {
            DriverError::Netlink { what: req.what(), reason: std::io::Error::from(kind).to_string() }
        }
        RouterError::Socket(e) => DriverError::Netlink { what: req.what(), reason: e.to_string() },
        RouterError::NoAck => {
            DriverError::Netlink { what: req.what(), reason: "the kernel sent no acknowledgement".into() }
        }
        RouterError::ClosedChannel => {
            DriverError::Netlink { what: req.what(), reason: "the netlink socket closed".into() }
        }
        // A message from another sender, or one that does not parse.
        RouterError::BadSeqOrPid(_) | RouterError::UnexpectedAck | RouterError::De(_) | RouterError::Msg(_) => {
            DriverError::Netlink { what: req.what(), reason: "the kernel's answer made no sense".into() }
        }
    }
}

impl Driver {
    /// Opens a generic netlink socket and looks the family up.
    pub fn open() -> Result<Driver, DriverError> {
        let (router, _multicast) = NlRouter::connect(NlFamily::Generic, Some(0), Groups::empty())
            .map_err(|e| router_error(Request::Family, e))?;
        let family = match router.resolve_genl_family(FAMILY) {
            Ok(id) => id,
            Err(RouterError::Msg(_)) => return Err(DriverError::NotLoaded),
            Err(e) => return Err(router_error(Request::Family, e)),
        };
        Ok(Driver { router, family })
    }

    /// Sends `msg` and collects the replies up to the acknowledgement.
    fn call(&self, req: Request, msg: Message) -> Result<Vec<Message>, DriverError> {
        let replies = self
            .router
            .send::<u16, Message, u16, Message>(self.family, NlmF::ACK, NlPayload::Payload(msg))
            .map_err(|e| router_error(req, e))?;
        let mut out = Vec::new();
        for reply in replies {
            let reply = reply.map_err(|e| router_error(req, e))?;
            if let NlPayload::Payload(p) = reply.nl_payload() {
                out.push(p.clone());
            }
        }
        Ok(out)
    }

    /// NBD_CMD_CONNECT on `socket`: the device's index.
    pub fn connect(&self, c: &Connect, socket: &std::os::unix::net::UnixStream) -> Result<u32, DriverError> {
        use std::os::fd::AsRawFd as _;
        let req = Request::Connect(c.index);
        let replies = self.call(req, connect_message(c, &[socket.as_raw_fd()]))?;
        replies.iter().find_map(reply_index).ok_or_else(|| DriverError::NoIndex { what: req.what() })
    }

    /// NBD_CMD_RECONFIGURE: /dev/nbd`index` is `size` bytes now.
    pub fn resize(&self, index: u32, size: u64) -> Result<(), DriverError> {
        self.call(Request::Resize(index, size), resize_message(index, size)).map(drop)
    }

    /// NBD_CMD_DISCONNECT: the driver sends NBD_CMD_DISC on the device's sockets and shuts
    /// them down; the device's size goes to 0 once its last user let go.
    pub fn disconnect(&self, index: u32) -> Result<(), DriverError> {
        self.call(Request::Disconnect(index), disconnect_message(index)).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `struct nlattr { __u16 nla_len; __u16 nla_type; }` in host order, then the payload, padded
    /// to NLA_ALIGNTO (4); nla_len counts header and payload, not the padding. NLA_F_NESTED is
    /// bit 15 of nla_type.
    fn nla(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(4 + payload.len() as u16).to_ne_bytes());
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend_from_slice(payload);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v
    }

    const NESTED: u16 = 1 << 15;

    /// `struct genlmsghdr { __u8 cmd; __u8 version; __u16 reserved; }`, then the attributes.
    fn genl(cmd: u8, attrs: &[Vec<u8>]) -> Vec<u8> {
        let mut v = vec![cmd, 1, 0, 0];
        for a in attrs {
            v.extend_from_slice(a);
        }
        v
    }

    fn bytes(m: &Message) -> Vec<u8> {
        let mut c = std::io::Cursor::new(Vec::new());
        m.to_bytes(&mut c).unwrap();
        c.into_inner()
    }

    /// Catches a wrong attribute number, payload width (INDEX is a u32, the rest u64), a
    /// missing NLA_F_NESTED, a socket not wrapped in its NBD_SOCK_ITEM, or INDEX sent for
    /// `auto` (the driver would take 0xffffffff as a device number).
    #[test]
    fn connect_matches_the_headers_layout() {
        let c = Connect { index: Index::Dev(3), size: 1 << 30, block_size: 4096, server_flags: 0x6d };
        let expect = genl(
            1,
            &[
                nla(1, &3u32.to_ne_bytes()),
                nla(2, &(1u64 << 30).to_ne_bytes()),
                nla(3, &4096u64.to_ne_bytes()),
                nla(5, &0x6du64.to_ne_bytes()),
                nla(7 | NESTED, &nla(1 | NESTED, &nla(1, &7u32.to_ne_bytes()))),
            ],
        );
        assert_eq!(bytes(&connect_message(&c, &[7])), expect);
        // The same, spelt out for x86's byte order, so that the helper above is checked too.
        #[cfg(target_endian = "little")]
        assert_eq!(
            &expect[expect.len() - 16..],
            &[16, 0, 7, 0x80, 12, 0, 1, 0x80, 8, 0, 1, 0, 7, 0, 0, 0],
            "SOCKETS {{ SOCK_ITEM {{ SOCK_FD 7 }} }}"
        );

        let any = Connect { index: Index::Any, ..c };
        let expect = genl(
            1,
            &[
                nla(2, &(1u64 << 30).to_ne_bytes()),
                nla(3, &4096u64.to_ne_bytes()),
                nla(5, &0x6du64.to_ne_bytes()),
                nla(
                    7 | NESTED,
                    &[nla(1 | NESTED, &nla(1, &7u32.to_ne_bytes())), nla(1 | NESTED, &nla(1, &9u32.to_ne_bytes()))]
                        .concat(),
                ),
            ],
        );
        assert_eq!(bytes(&connect_message(&any, &[7, 9])), expect);
    }

    /// Catches RECONFIGURE sent as another command, or its size as anything but a u64.
    #[test]
    fn resize_and_disconnect_match_the_headers_layout() {
        let grown = 1_342_177_280u64;
        assert_eq!(
            bytes(&resize_message(0, grown)),
            genl(3, &[nla(1, &0u32.to_ne_bytes()), nla(2, &grown.to_ne_bytes())])
        );
        assert_eq!(bytes(&disconnect_message(12)), genl(2, &[nla(1, &12u32.to_ne_bytes())]));
    }

    /// The index comes back from the driver's reply (a CONNECT with one INDEX attribute).
    #[test]
    fn the_connect_reply_names_the_index() {
        use neli::FromBytesWithInput as _;
        let raw = genl(1, &[nla(1, &5u32.to_ne_bytes())]);
        let reply = Message::from_bytes_with_input(&mut std::io::Cursor::new(&raw), raw.len()).unwrap();
        assert_eq!(reply_index(&reply), Some(5));
        let raw = genl(1, &[]);
        let empty = Message::from_bytes_with_input(&mut std::io::Cursor::new(&raw), raw.len()).unwrap();
        assert_eq!(reply_index(&empty), None);
    }

    /// `--nbd-device` takes /dev/nbdN and auto; a typo is a usage error naming both forms.
    #[test]
    fn device_arguments() {
        assert_eq!(Index::parse("/dev/nbd0"), Ok(Index::Dev(0)));
        assert_eq!(Index::parse("/dev/nbd15"), Ok(Index::Dev(15)));
        assert_eq!(Index::parse("auto"), Ok(Index::Any));
        for bad in [
            "",
            "nbd0",
            "/dev/nbd",
            "/dev/nbd-1",
            "/dev/nbd+1",
            "/dev/nbd01",
            "/dev/nbd0p1",
            "/dev/sda",
            "/dev/nbd1048576",
            "/dev/nbd99999999999",
            "AUTO",
        ] {
            let e = Index::parse(bad).unwrap_err();
            assert!(e.contains("expected /dev/nbdN") && e.contains("or auto"), "{bad:?}: {e}");
        }
    }

    /// The errnos a user meets read as what to do, not as numbers or Debug.
    #[test]
    fn errors_read_as_words() {
        let none = |_| None;
        assert_eq!(
            DriverError::from_errno(Request::Family, libc::ENOENT, none).to_string(),
            "the nbd driver is not loaded (modprobe nbd)"
        );
        assert_eq!(
            DriverError::from_errno(Request::Connect(Index::Dev(0)), libc::EPERM, none).to_string(),
            "connecting /dev/nbd0: the nbd driver allows this to root only (CAP_SYS_ADMIN)"
        );
        assert_eq!(
            DriverError::from_errno(Request::Connect(Index::Dev(2)), libc::EBUSY, |i| Some((1000 + i, true)))
                .to_string(),
            "/dev/nbd2 is in use (connected by pid 1002): pick another device, or --nbd-device auto"
        );
        assert_eq!(
            DriverError::from_errno(Request::Connect(Index::Dev(2)), libc::EBUSY, |_| Some((7, false))).to_string(),
            "/dev/nbd2 is in use (connected by pid 7, which has exited; `nbd-client -d /dev/nbd2` disconnects it): \
             pick another device, or --nbd-device auto"
        );
        assert_eq!(
            DriverError::from_errno(Request::Connect(Index::Dev(2)), libc::EBUSY, none).to_string(),
            "/dev/nbd2 is in use: pick another device, or --nbd-device auto"
        );
        let e = DriverError::from_errno(Request::Resize(1, 3 << 30), libc::EINVAL, none).to_string();
        assert_eq!(
            e,
            "resizing /dev/nbd1 to 3 GiB: the nbd driver refused (invalid argument; the kernel log says why: dmesg)"
        );
        let e = DriverError::from_errno(Request::Disconnect(4), libc::EINVAL, none).to_string();
        assert!(e.starts_with("disconnecting /dev/nbd4: the nbd driver refused (invalid argument"), "{e}");
        for e in [libc::ENOENT, libc::EPERM, libc::EBUSY, libc::EINVAL, libc::ENOMEM, 4095] {
            for req in [Request::Connect(Index::Any), Request::Resize(0, 1), Request::Disconnect(0)] {
                let text = DriverError::from_errno(req, e, none).to_string();
                assert!(!text.contains("os error") && !text.contains("Os {") && !text.contains("errno:"), "{text}");
            }
        }
    }

    /// Against this machine's kernel: with the nbd module loaded the family resolves, without it
    /// the error is the one that says to load it (catches the controller's ENOENT, or neli's
    /// "not found", read as anything else).
    #[test]
    fn the_driver_is_found_or_said_to_be_missing() {
        let loaded = std::path::Path::new("/sys/module/nbd").exists();
        match Driver::open() {
            Ok(d) => assert!(loaded, "the family resolved ({d:?}) but /sys/module/nbd is missing"),
            Err(e) => {
                assert!(!loaded, "the nbd module is loaded, yet: {e}");
                assert_eq!(e, DriverError::NotLoaded);
            }
        }
    }
}
