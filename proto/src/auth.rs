//! AUTH's proof: HMAC-SHA256 under a key of CHALLENGE's nonce, followed by the host identity
//! when the peers negotiated [`FEATURE_HOST_ID`](crate::FEATURE_HOST_ID). The nonce is fixed
//! length, so nonce and name cannot be shifted into one another, and a name is never empty, so
//! a host's MAC never equals the base message's MAC of the same nonce.
//!
//! That v1 proof binds neither direction, nor the target, nor the connection: a rogue target can
//! relay a real target's nonce to an initiator and its answer back. With
//! [`FEATURE_MUTUAL_AUTH`](crate::FEATURE_MUTUAL_AUTH) both sides prove the key with
//! [`mutual_mac`] over a [`Transcript`] of the exchange and of the connection's addresses, each
//! direction under its own derived key.

use core::net::{IpAddr, SocketAddr};

use hkdf::Hkdf;
use hmac::{Hmac, Mac};

use crate::{MAC_LEN, NONCE_LEN, TARGET_ID_LEN};

/// The MAC an initiator sends in AUTH for `nonce` (and `host`, with host identities) under
/// `key`. None only if the MAC cannot be keyed (HMAC takes keys of any length, so never).
pub fn auth_mac(key: &[u8], nonce: &[u8; NONCE_LEN], host: Option<&str>) -> Option<[u8; MAC_LEN]> {
    let mut m = Hmac::<sha2::Sha256>::new_from_slice(key).ok()?;
    m.update(nonce);
    if let Some(host) = host {
        m.update(host.as_bytes());
    }
    Some(m.finalize().into_bytes().into())
}

/// True if `mac` is [`auth_mac`] of `nonce` and `host` under `key` (compared in constant time).
pub fn verify_auth_mac(key: &[u8], nonce: &[u8; NONCE_LEN], host: Option<&str>, mac: &[u8; MAC_LEN]) -> bool {
    let Ok(mut m) = Hmac::<sha2::Sha256>::new_from_slice(key) else { return false };
    m.update(nonce);
    if let Some(host) = host {
        m.update(host.as_bytes());
    }
    m.verify_slice(mac).is_ok()
}

/// Which way a v2 proof goes: each direction has a key of its own (HKDF of the configured key
/// with a label), so the target's proof can never be the initiator's reflected back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// AUTH's MAC: the initiator proves the key.
    InitiatorToTarget,
    /// OK(AUTH)'s MAC: the target proves the key back.
    TargetToInitiator,
}

impl Direction {
    fn label(self) -> &'static [u8] {
        match self {
            Direction::InitiatorToTarget => b"rblk auth v2: initiator to target",
            Direction::TargetToInitiator => b"rblk auth v2: target to initiator",
        }
    }
}

/// Everything a v2 proof ([`FEATURE_MUTUAL_AUTH`](crate::FEATURE_MUTUAL_AUTH)) binds: the
/// HELLO and CHALLENGE words as sent (a stripped or flipped feature bit changes them), both
/// nonces, the host, and the connection's two rdma_cm addresses as the side computing the MAC
/// sees them. A relay through a third party sees other addresses than either end, so its
/// victim's proof does not verify at the target it relays to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transcript<'a> {
    /// HELLO's `features`, as the initiator sent them.
    pub hello_features: u64,
    /// CHALLENGE's `flags` word.
    pub challenge_flags: u32,
    /// CHALLENGE's `features`.
    pub challenge_features: u64,
    /// CHALLENGE's nonce (the target's).
    pub target_nonce: [u8; NONCE_LEN],
    /// AUTH's nonce (the initiator's).
    pub initiator_nonce: [u8; NONCE_LEN],
    /// The host AUTH names.
    pub host: &'a str,
    /// The target's address: where the initiator connected to; what the target accepted on.
    pub target_addr: SocketAddr,
    /// The initiator's address: where it connected from; the peer the target sees.
    pub initiator_addr: SocketAddr,
}

/// A v2 proof in `direction` under (a key derived from) `key` of `transcript`; the target's
/// proof also binds its identity. None only if a key cannot be derived (never: HKDF-SHA256
/// takes keys of any length).
pub fn mutual_mac(
    key: &[u8],
    direction: Direction,
    transcript: &Transcript<'_>,
    target_id: Option<&[u8; TARGET_ID_LEN]>,
) -> Option<[u8; MAC_LEN]> {
    Some(mutual_hmac(key, direction, transcript, target_id)?.finalize().into_bytes().into())
}

/// True if `mac` is [`mutual_mac`] of the same inputs (compared in constant time).
pub fn verify_mutual_mac(
    key: &[u8],
    direction: Direction,
    transcript: &Transcript<'_>,
    target_id: Option<&[u8; TARGET_ID_LEN]>,
    mac: &[u8; MAC_LEN],
) -> bool {
    mutual_hmac(key, direction, transcript, target_id).is_some_and(|m| m.verify_slice(mac).is_ok())
}

fn mutual_hmac(
    key: &[u8],
    direction: Direction,
    t: &Transcript<'_>,
    target_id: Option<&[u8; TARGET_ID_LEN]>,
) -> Option<Hmac<sha2::Sha256>> {
    let mut derived = [0u8; 32];
    Hkdf::<sha2::Sha256>::new(Some(b"rblk mutual authentication"), key).expand(direction.label(), &mut derived).ok()?;
    let mut m = Hmac::<sha2::Sha256>::new_from_slice(&derived).ok()?;
    // Every field has a fixed length or a length prefix, so no two transcripts encode alike.
    m.update(direction.label());
    m.update(&t.hello_features.to_le_bytes());
    m.update(&t.challenge_flags.to_le_bytes());
    m.update(&t.challenge_features.to_le_bytes());
    m.update(&t.target_nonce);
    m.update(&t.initiator_nonce);
    m.update(&[u8::try_from(t.host.len()).ok()?]);
    m.update(t.host.as_bytes());
    update_addr(&mut m, t.target_addr);
    update_addr(&mut m, t.initiator_addr);
    match target_id {
        Some(id) => {
            m.update(&[1]);
            m.update(id);
        }
        None => m.update(&[0]),
    }
    Some(m)
}

/// An address as a family tag, the IP (an IPv4-mapped IPv6 address as the IPv4 address it is,
/// as a listener on `::` reports IPv4 peers) and the port.
fn update_addr(m: &mut Hmac<sha2::Sha256>, addr: SocketAddr) {
    match addr.ip().to_canonical() {
        IpAddr::V4(ip) => {
            m.update(&[4]);
            m.update(&ip.octets());
        }
        IpAddr::V6(ip) => {
            m.update(&[6]);
            m.update(&ip.octets());
        }
    }
    m.update(&addr.port().to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_sha256_rfc4231_case_2_and_the_host_binding() {
        // RFC 4231 test case 2's message is 28 bytes; the nonce is 32, so pad the check: the
        // MAC must equal HMAC-SHA256("Jefe", message) computed by the same primitive.
        let nonce = [7u8; NONCE_LEN];
        let base = auth_mac(b"Jefe", &nonce, None).unwrap();
        assert!(verify_auth_mac(b"Jefe", &nonce, None, &base));
        assert!(!verify_auth_mac(b"jefe", &nonce, None, &base), "another key");
        assert!(!verify_auth_mac(b"Jefe", &[8; NONCE_LEN], None, &base), "another nonce (a replay)");
        let host = auth_mac(b"Jefe", &nonce, Some("db1")).unwrap();
        assert_ne!(host, base);
        assert!(verify_auth_mac(b"Jefe", &nonce, Some("db1"), &host));
        assert!(!verify_auth_mac(b"Jefe", &nonce, Some("db2"), &host), "another host");
        assert!(!verify_auth_mac(b"Jefe", &nonce, None, &host), "the base message");
        let mut m = Hmac::<sha2::Sha256>::new_from_slice(b"Jefe").unwrap();
        m.update(b"what do ya want for nothing?");
        let hex = crate::to_hex(&m.finalize().into_bytes());
        assert_eq!(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    fn transcript() -> Transcript<'static> {
        Transcript {
            hello_features: crate::FEATURES,
            challenge_flags: 1,
            challenge_features: crate::FEATURES,
            target_nonce: [1; NONCE_LEN],
            initiator_nonce: [2; NONCE_LEN],
            host: "db1",
            target_addr: "10.0.0.1:7420".parse().unwrap(),
            initiator_addr: "10.0.0.2:40000".parse().unwrap(),
        }
    }

    /// Would catch a v2 MAC that leaves out any field of the transcript (each change below must
    /// break it), that does not tell the directions apart (a target reflecting the initiator's
    /// proof), that ignores the target's identity, or that tells an IPv4 address from the same
    /// address seen through an IPv6 wildcard listener.
    #[test]
    fn a_mutual_mac_binds_every_field_and_the_direction() {
        let key = b"the shared secret, 32 bytes or more";
        let t = transcript();
        let id = [9; TARGET_ID_LEN];
        let i2t = mutual_mac(key, Direction::InitiatorToTarget, &t, None).unwrap();
        assert!(verify_mutual_mac(key, Direction::InitiatorToTarget, &t, None, &i2t));
        assert!(!verify_mutual_mac(key, Direction::TargetToInitiator, &t, None, &i2t), "reflected");
        assert!(!verify_mutual_mac(
            b"another key, also 32 bytes or more",
            Direction::InitiatorToTarget,
            &t,
            None,
            &i2t
        ));
        assert_ne!(i2t, auth_mac(key, &t.target_nonce, Some(t.host)).unwrap(), "v1's MAC");
        let t2i = mutual_mac(key, Direction::TargetToInitiator, &t, Some(&id)).unwrap();
        assert!(verify_mutual_mac(key, Direction::TargetToInitiator, &t, Some(&id), &t2i));
        assert!(!verify_mutual_mac(key, Direction::TargetToInitiator, &t, Some(&[8; TARGET_ID_LEN]), &t2i));
        assert!(!verify_mutual_mac(key, Direction::TargetToInitiator, &t, None, &t2i));
        let changed: [(&str, Transcript<'_>); 9] = [
            ("hello", Transcript { hello_features: t.hello_features & !crate::FEATURE_MUTUAL_AUTH, ..t }),
            ("flags", Transcript { challenge_flags: 0, ..t }),
            ("challenge features", Transcript { challenge_features: t.challenge_features ^ 1, ..t }),
            ("target nonce", Transcript { target_nonce: [3; NONCE_LEN], ..t }),
            ("initiator nonce", Transcript { initiator_nonce: [3; NONCE_LEN], ..t }),
            ("host", Transcript { host: "db2", ..t }),
            ("target address", Transcript { target_addr: "10.0.0.3:7420".parse().unwrap(), ..t }),
            ("target port", Transcript { target_addr: "10.0.0.1:7421".parse().unwrap(), ..t }),
            ("initiator address", Transcript { initiator_addr: "10.0.0.3:40000".parse().unwrap(), ..t }),
        ];
        for (what, other) in changed {
            assert!(!verify_mutual_mac(key, Direction::InitiatorToTarget, &other, None, &i2t), "{what}");
        }
        let mapped = Transcript { target_addr: "[::ffff:10.0.0.1]:7420".parse().unwrap(), ..t };
        assert!(verify_mutual_mac(key, Direction::InitiatorToTarget, &mapped, None, &i2t));
    }
}
