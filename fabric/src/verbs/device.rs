//! Device listing and one shared device context per device.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};

use sideway::ibverbs::device::{DeviceInfo as _, DeviceList};
use sideway::ibverbs::device_context::DeviceContext;

use crate::{DeviceInfo, Error, PortInfo, Result};

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

/// The process-wide context of device `name`, opened on first use.
pub(crate) fn context(name: &str) -> Result<Arc<DeviceContext>> {
    static CONTEXTS: OnceLock<Mutex<HashMap<String, Arc<DeviceContext>>>> = OnceLock::new();
    let mut map = CONTEXTS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(ctx) = map.get(name) {
        return Ok(Arc::clone(ctx));
    }
    let list = DeviceList::new().map_err(|e| verbs_err("ibv_get_device_list", name, e))?;
    let dev =
        list.iter().find(|d| d.name() == name).ok_or_else(|| Error::NoDevice { filter: Some(name.to_owned()) })?;
    let ctx = dev.open().map_err(|e| verbs_err("ibv_open_device", name, e))?;
    map.insert(name.to_owned(), Arc::clone(&ctx));
    Ok(ctx)
}

#[cfg(test)]
mod tests {
    use super::why_none;

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
