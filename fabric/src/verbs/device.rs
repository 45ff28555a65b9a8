//! Device listing and one shared device context per device.

use std::collections::HashMap;
use std::net::IpAddr;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use sideway::ibverbs::device::{DeviceInfo as _, DeviceList};
use sideway::ibverbs::device_context::DeviceContext;

use std::os::fd::RawFd;

use rdma_mummy_sys as sys;

use super::shared_cq::SharedCq;
use crate::{DeviceEvent, DeviceEventKind, DeviceInfo, Error, PortInfo, Result};

fn verbs_err(op: &'static str, device: &str, e: impl std::fmt::Display) -> Error {
    Error::Verbs { op, device: device.to_owned(), source: std::io::Error::other(e.to_string()) }
}

/// Lists the RDMA devices with their ports and the IP addresses in their GID tables.
pub(crate) fn list() -> Result<Vec<DeviceInfo>> {
    let list = match DeviceList::new() {
        Ok(l) => l,
        // No libibverbs, no uverbs devices or no kernel support all mean "no device" to a user.
        Err(_) => return Ok(Vec::new()),
    };
    let mut out = Vec::new();
    for dev in list.iter() {
        let name = dev.name();
        let Ok(ctx) = context(&name) else { continue };
        let mut ports = Vec::new();
        let port_count = ctx.query_device().map(|a| a.phys_port_cnt()).unwrap_or(0);
        for port in 1..=port_count {
            let Ok(attr) = ctx.query_port(port) else { continue };
            let mut addrs = Vec::new();
            let (mut netdevs, mut gid_types) = (Vec::new(), Vec::new());
            if let Ok(table) = ctx.query_gid_table() {
                for entry in table.iter().filter(|e| e.port_num() == u32::from(port)) {
                    let kind = match entry.gid_type() {
                        sideway::ibverbs::address::GidType::InfiniBand => "IB",
                        sideway::ibverbs::address::GidType::RoceV1 => "RoCE v1",
                        sideway::ibverbs::address::GidType::RoceV2 => "RoCE v2",
                    };
                    if !gid_types.iter().any(|k| k == kind) {
                        gid_types.push(kind.to_owned());
                    }
                    if let Ok(nd) = entry.netdev_name() {
                        if !nd.is_empty() && !netdevs.contains(&nd) {
                            netdevs.push(nd);
                        }
                    }
                    let gid = entry.gid();
                    let raw: [u8; 16] = gid.raw;
                    if raw == [0; 16] {
                        continue;
                    }
                    let v6 = std::net::Ipv6Addr::from(raw);
                    let ip = v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6));
                    if !addrs.contains(&ip) {
                        addrs.push(ip);
                    }
                }
            }
            ports.push(PortInfo {
                port,
                active: attr.port_state() == sideway::ibverbs::device_context::PortState::Active,
                state: format!("{:?}", attr.port_state()),
                addrs,
                link_layer: match attr.link_layer() {
                    sideway::ibverbs::device_context::LinkLayer::Ethernet => "Ethernet".into(),
                    sideway::ibverbs::device_context::LinkLayer::InfiniBand => "InfiniBand".into(),
                    sideway::ibverbs::device_context::LinkLayer::Unspecified => "unspecified".into(),
                },
                active_mtu: 128 << (attr.active_mtu() as u32),
                netdevs,
                gid_types,
            });
        }
        out.push(DeviceInfo { name, ports });
    }
    Ok(out)
}

/// Why no device is listed, judged from the kernel's view: `sys` is /sys/class/infiniband,
/// `dev` /dev/infiniband (parameters, so tests can point them elsewhere).
pub(crate) fn why_none(sys: &std::path::Path, dev: &std::path::Path) -> String {
    let devices: Vec<String> = std::fs::read_dir(sys)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    if !sys.exists() {
        return "no RDMA driver is loaded (no /sys/class/infiniband): load your NIC's (mlx5_ib, irdma, ...) or, \
                for Soft-RoCE, `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev ETH`"
            .into();
    }
    if devices.is_empty() {
        return "the RDMA core is loaded but there is no RDMA device: for Soft-RoCE, \
                `rdma link add rxe0 type rxe netdev ETH`"
            .into();
    }
    let verbs: Vec<std::path::PathBuf> = std::fs::read_dir(dev)
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.to_string_lossy().contains("uverbs")).collect())
        .unwrap_or_default();
    if verbs.is_empty() {
        return format!(
            "devices {} exist, but {} has no uverbs files: load ib_uverbs (`modprobe ib_uverbs`)",
            devices.join(", "),
            dev.display()
        );
    }
    if let Some(p) = verbs.iter().find(|p| std::fs::OpenOptions::new().read(true).write(true).open(p).is_err()) {
        return format!(
            "devices {} exist, but {} cannot be opened by this user: run as root, or give the user access \
             (the rdma group, or a udev rule)",
            devices.join(", "),
            p.display()
        );
    }
    format!(
        "devices {} exist and their verbs files open, but libibverbs lists none: is the provider library \
         (rdma-core's ibverbs-providers) installed?",
        devices.join(", ")
    )
}

/// The devices' contexts opened so far, by name: each opened once per process, never closed.
static CONTEXTS: OnceLock<Mutex<HashMap<String, Arc<DeviceContext>>>> = OnceLock::new();

fn contexts() -> std::sync::MutexGuard<'static, HashMap<String, Arc<DeviceContext>>> {
    CONTEXTS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// The process-wide context of device `name`, opened on first use (its asynchronous events
/// readable without blocking: [`async_events`]).
pub(crate) fn context(name: &str) -> Result<Arc<DeviceContext>> {
    let mut map = contexts();
    if let Some(ctx) = map.get(name) {
        return Ok(Arc::clone(ctx));
    }
    let list = DeviceList::new().map_err(|e| verbs_err("ibv_get_device_list", name, e))?;
    let dev =
        list.iter().find(|d| d.name() == name).ok_or_else(|| Error::NoDevice { filter: Some(name.to_owned()) })?;
    let ctx = dev.open().map_err(|e| verbs_err("ibv_open_device", name, e))?;
    let fd = async_fd(&ctx);
    // SAFETY: fcntl on the context's own descriptor, open as long as the context (never closed:
    // the map keeps it); a failure leaves it blocking and is reported.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK) } < 0 {
        return Err(verbs_err(
            "fcntl(O_NONBLOCK) on the async event descriptor",
            name,
            std::io::Error::last_os_error(),
        ));
    }
    map.insert(name.to_owned(), Arc::clone(&ctx));
    Ok(ctx)
}

/// The descriptor a device's asynchronous events arrive on.
fn async_fd(ctx: &DeviceContext) -> RawFd {
    // SAFETY: the context is open (the caller holds it); libibverbs set `async_fd` when it
    // opened the device and never changes it; it is only read.
    unsafe { (*ctx.context().as_ptr()).async_fd }
}

/// Fills `out` with the asynchronous-event descriptors of the devices opened so far (readable
/// when an event waits: [`async_events`] takes them), as many as fit; returns how many.
pub(crate) fn async_fds(out: &mut [RawFd]) -> usize {
    let map = contexts();
    out.iter_mut().zip(map.values()).map(|(slot, ctx)| *slot = async_fd(ctx)).count()
}

/// The shared CQs with an SRQ, by the SRQ's address: where its low-water event goes.
fn srqs() -> MutexGuard<'static, HashMap<usize, Weak<SharedCq>>> {
    static SRQS: OnceLock<Mutex<HashMap<usize, Weak<SharedCq>>>> = OnceLock::new();
    SRQS.get_or_init(Default::default).lock().unwrap_or_else(PoisonError::into_inner)
}

/// The low-water event of `srq` goes to `cq` (its owner) from now on.
pub(crate) fn watch_srq(srq: NonNull<sys::ibv_srq>, cq: &Arc<SharedCq>) {
    srqs().insert(srq.as_ptr() as usize, Arc::downgrade(cq));
}

/// `srq` is about to be destroyed.
pub(crate) fn unwatch_srq(srq: NonNull<sys::ibv_srq>) {
    srqs().remove(&(srq.as_ptr() as usize));
}

/// Takes every asynchronous event waiting on the devices opened so far (without blocking),
/// acknowledges each, and appends what it said to `out`.
pub(crate) fn async_events(out: &mut std::collections::VecDeque<DeviceEvent>) {
    let map = contexts();
    for (name, ctx) in map.iter() {
        loop {
            let mut ev = std::mem::MaybeUninit::<sys::ibv_async_event>::uninit();
            // SAFETY: the context is open; `ev` is written by libibverbs when it returns 0 (and
            // the descriptor is non-blocking: with nothing waiting it fails with EAGAIN).
            if unsafe { sys::ibv_get_async_event(ctx.context().as_ptr(), ev.as_mut_ptr()) } != 0 {
                break;
            }
            // SAFETY: libibverbs filled it (it returned 0).
            let mut ev = unsafe { ev.assume_init() };
            // Read as a number, not as the bindings' Rust enum: a newer kernel's event type
            // would be an invalid value of it.
            // SAFETY: `event_type` is a C enum, 4 bytes, inside the live `ev`.
            let code = unsafe { std::ptr::addr_of!(ev.event_type).cast::<u32>().read() };
            let qp_num = || {
                // SAFETY: for QP events libibverbs sets `element.qp` to the QP, which stays
                // valid until the event is acknowledged below (ibv_destroy_qp waits for that).
                unsafe { ev.element.qp.as_ref().map_or(0, |qp| qp.qp_num) }
            };
            // SAFETY: for port events `element.port_num` is what libibverbs set.
            let port = || u8::try_from(unsafe { ev.element.port_num }).unwrap_or(0);
            let (kind, what) = translate(code, qp_num, port);
            if kind == DeviceEventKind::SrqLimit {
                // SAFETY: for SRQ events libibverbs sets `element.srq`, valid until the event is
                // acknowledged below (ibv_destroy_srq waits for that); only its address is used.
                let srq = unsafe { ev.element.srq } as usize;
                let owner = srqs().get(&srq).and_then(Weak::upgrade);
                if let Some(cq) = owner {
                    cq.receives_low();
                }
            }
            // SAFETY: `ev` came from ibv_get_async_event and is acknowledged once, here, after
            // the last read of its element.
            unsafe { sys::ibv_ack_async_event(&mut ev) };
            out.push_back(DeviceEvent { device: name.clone(), kind, what });
        }
    }
}

/// What asynchronous event type `code` (`ibv_event_type`) means, and its name.
fn translate(code: u32, qp_num: impl FnOnce() -> u32, port: impl FnOnce() -> u8) -> (DeviceEventKind, &'static str) {
    use DeviceEventKind as K;
    match code {
        0 => (K::CqFailed, "CQ error (overrun)"),
        1 => (K::QpFailed { qp_num: qp_num() }, "QP fatal error"),
        2 => (K::QpFailed { qp_num: qp_num() }, "QP invalid request error"),
        3 => (K::QpFailed { qp_num: qp_num() }, "QP access error"),
        4 => (K::Qp { qp_num: qp_num() }, "communication established"),
        5 => (K::Qp { qp_num: qp_num() }, "send queue drained"),
        6 => (K::Qp { qp_num: qp_num() }, "path migrated"),
        7 => (K::Qp { qp_num: qp_num() }, "path migration failed"),
        8 => (K::DeviceFatal, "device fatal error"),
        9 => (K::Port { port: port(), active: Some(true) }, "port active"),
        10 => (K::Port { port: port(), active: Some(false) }, "port down"),
        11 => (K::Port { port: port(), active: None }, "LID changed"),
        12 => (K::Port { port: port(), active: None }, "P_Key table changed"),
        13 => (K::Port { port: port(), active: None }, "subnet manager changed"),
        14 => (K::Other, "SRQ error"),
        15 => (K::SrqLimit, "SRQ limit reached"),
        16 => (K::Qp { qp_num: qp_num() }, "last WQE reached"),
        17 => (K::Port { port: port(), active: None }, "client reregistration asked"),
        18 => (K::Port { port: port(), active: None }, "GID table changed"),
        19 => (K::Other, "WQ fatal error"),
        20 => (K::Port { port: port(), active: None }, "link speed changed"),
        _ => (K::Other, "unknown event"),
    }
}

#[cfg(test)]
mod tests {
    use super::{translate, why_none};
    use crate::DeviceEventKind as K;

    /// Catches an event type read as the wrong kind: a QP's error not ending its connection, a
    /// port's state lost, or an unknown type (a newer kernel's) taken for anything.
    #[test]
    fn async_event_types_mean_what_libibverbs_says() {
        assert_eq!(translate(1, || 7, || 0), (K::QpFailed { qp_num: 7 }, "QP fatal error"));
        assert_eq!(translate(3, || 9, || 0).0, K::QpFailed { qp_num: 9 });
        assert_eq!(translate(4, || 9, || 0).0, K::Qp { qp_num: 9 });
        assert_eq!(translate(10, || 0, || 1), (K::Port { port: 1, active: Some(false) }, "port down"));
        assert_eq!(translate(9, || 0, || 2).0, K::Port { port: 2, active: Some(true) });
        assert_eq!(translate(18, || 0, || 1).0, K::Port { port: 1, active: None });
        assert_eq!(translate(0, || 0, || 0).0, K::CqFailed);
        assert_eq!(translate(8, || 0, || 0).0, K::DeviceFatal);
        assert_eq!(translate(21, || panic!("not a QP event"), || panic!("not a port event")).0, K::Other);
    }

    /// Catches a "no device" that does not say which step is missing.
    #[test]
    fn says_why_there_is_no_device() {
        let root = std::env::temp_dir().join(format!("rblk-why-none-{}", std::process::id()));
        let (sys, dev) = (root.join("sys"), root.join("dev"));
        assert!(why_none(&sys, &dev).contains("no RDMA driver is loaded"));
        std::fs::create_dir_all(&sys).unwrap();
        assert!(why_none(&sys, &dev).contains("there is no RDMA device"));
        std::fs::create_dir_all(sys.join("rxe0")).unwrap();
        assert!(why_none(&sys, &dev).contains("load ib_uverbs"));
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("uverbs0"), b"").unwrap();
        assert!(why_none(&sys, &dev).contains("libibverbs lists none"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
