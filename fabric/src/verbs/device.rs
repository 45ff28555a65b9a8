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
            if let Ok(table) = ctx.query_gid_table() {
                for entry in table.iter().filter(|e| e.port_num() == u32::from(port)) {
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
            });
        }
        out.push(DeviceInfo { name, ports });
    }
    Ok(out)
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
