//! AUTH's proof: HMAC-SHA256 under a key of CHALLENGE's nonce, followed by the host identity
//! when the peers negotiated [`FEATURE_HOST_ID`](crate::FEATURE_HOST_ID). The nonce is fixed
//! length, so nonce and name cannot be shifted into one another, and a name is never empty, so
//! a host's MAC never equals the base message's MAC of the same nonce.

use hmac::{Hmac, Mac};

use crate::{MAC_LEN, NONCE_LEN};

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
}
