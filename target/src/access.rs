//! Who may do what: the keys initiators prove (a shared key, and hosts' own keys) and each
//! volume's access list, as NVMe-oF's DH-HMAC-CHAP host keys and a subsystem's allowed hosts.
//!
//! - A host with its own key must prove that key (a shared key does not stand in for it).
//! - Any other host, and an initiator without host identities (anonymous), proves the shared
//!   key, when there is one.
//! - A target with no key at all takes a host's name as claimed (as NVMe-oF without
//!   authentication takes a host NQN): access lists then sort out honest hosts, not attackers.
//! - A volume with an access list may be opened only by the hosts it names (or `*`), in the
//!   modes granted; a volume without one by any host that got in.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use rblk_proto::{OpenMode, Transcript, MAC_LEN, NONCE_LEN, TARGET_ID_LEN};
use subtle::ConstantTimeEq as _;

/// Who may get in and open what, as a reload compares it. Keys appear only as short
/// fingerprints ([`fingerprint`]), so this may leave the daemon.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Access {
    /// The shared key's fingerprint, if there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_key: Option<String>,
    /// Known hosts, with their own key's fingerprint.
    #[serde(default)]
    pub hosts: BTreeMap<String, Option<String>>,
    /// Volumes, with their access list (None: every host that got in may open it).
    #[serde(default)]
    pub volumes: BTreeMap<String, Option<Acl>>,
    /// Who must use mutual authentication (AUTH v2): host names, `*` for every host. Empty
    /// from a daemon that predates it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub mutual: std::collections::BTreeSet<String>,
}

impl Access {
    /// Whether initiators must prove a key.
    pub fn auth_required(&self) -> bool {
        self.shared_key.is_some() || self.hosts.values().any(Option::is_some)
    }
}

/// What a host may do with a volume. Each grant includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Grant {
    /// Read-only opens (`ro`).
    ReadOnly,
    /// Read-only and read-write opens (`rw`).
    ReadWrite,
    /// Any open, exclusive ones too (`exclusive`).
    Exclusive,
}

impl Grant {
    /// Whether an open in `mode` is within the grant.
    pub fn permits(self, mode: OpenMode) -> bool {
        let needs = match mode {
            OpenMode::ReadOnly => Grant::ReadOnly,
            OpenMode::ReadWrite => Grant::ReadWrite,
            OpenMode::Exclusive => Grant::Exclusive,
        };
        self >= needs
    }
}

/// A grant that is not `ro`, `rw` or `exclusive`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an access mode (use ro, rw or exclusive)")]
pub struct BadGrant(pub String);

impl std::str::FromStr for Grant {
    type Err = BadGrant;
    fn from_str(s: &str) -> Result<Grant, BadGrant> {
        match s {
            "ro" | "read-only" => Ok(Grant::ReadOnly),
            "rw" | "read-write" => Ok(Grant::ReadWrite),
            "exclusive" => Ok(Grant::Exclusive),
            _ => Err(BadGrant(s.to_owned())),
        }
    }
}

impl TryFrom<String> for Grant {
    type Error = BadGrant;
    fn try_from(s: String) -> Result<Grant, BadGrant> {
        s.parse()
    }
}

impl From<Grant> for String {
    fn from(g: Grant) -> String {
        g.to_string()
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Grant::ReadOnly => "ro",
            Grant::ReadWrite => "rw",
            Grant::Exclusive => "exclusive",
        })
    }
}

/// A volume's access list: host name (or `*`, any host) to grant.
pub type Acl = BTreeMap<String, Grant>;

/// The access-list entry that stands for every host.
pub const ANY_HOST: &str = "*";

/// A known host.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct HostSpec {
    /// Its identity, as the initiator presents it (`rblk --host-id`, default its hostname).
    pub name: String,
    /// Its own key; None: it proves the shared key, if any.
    pub key: Option<Vec<u8>>,
    /// It must authenticate with AUTH v2 ([`rblk_proto::FEATURE_MUTUAL_AUTH`]): its v1 AUTH is
    /// refused, so its key cannot be relayed through an older initiator.
    pub require_mutual_auth: bool,
}

// Never print a key.
impl fmt::Debug for HostSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostSpec")
            .field("name", &self.name)
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("require_mutual_auth", &self.require_mutual_auth)
            .finish()
    }
}

/// Why hosts or access lists cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A host name that an initiator could not send.
    #[error("host {0:?}: a host name is 1-{max} printable ASCII characters without spaces", max = rblk_proto::MAX_HOST_ID)]
    BadHostName(String),
    /// A shared key of zero bytes (it would prove nothing).
    #[error("the shared key is empty")]
    EmptySharedKey,
    /// The same host twice.
    #[error("host {0} is configured twice")]
    DuplicateHost(String),
    /// An access list for a volume that is not served.
    #[error("access list for volume {0:?}, which is not configured")]
    UnknownVolume(String),
    /// An access list naming something that is not a host name.
    #[error("volume {volume}: {entry:?} is not a host name")]
    BadAclEntry {
        /// The volume.
        volume: String,
        /// The entry.
        entry: String,
    },
}

/// Why a host may not open a volume: [`AccessError::Mode`] is sent to the initiator as the
/// refusal's text; [`AccessError::NotListed`] only goes to the log (the initiator is told the
/// volume does not exist, as for an unknown name, so that names cannot be probed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AccessError {
    /// The host's grant does not cover the mode.
    #[error("host {} may not open volume {volume} {} (its access list grants {grant})", who(host), mode_name(*mode))]
    Mode {
        /// The host (None: anonymous).
        host: Option<String>,
        /// The volume.
        volume: String,
        /// The mode asked for.
        mode: OpenMode,
        /// What the list grants it.
        grant: Grant,
    },
    /// The host is not on the list (and the list has no `*`).
    #[error("host {} is not on volume {volume}'s access list", who(host))]
    NotListed {
        /// The host (None: anonymous).
        host: Option<String>,
        /// The volume.
        volume: String,
    },
}

fn who(host: &Option<String>) -> &str {
    host.as_deref().unwrap_or("(anonymous: the initiator sent no host identity)")
}

/// What an initiator is told when AUTH fails: one text for a wrong key, an unknown host and a
/// known host without a key, so that a refusal does not tell known hosts from unknown ones. The
/// daemon's log has the [`AuthError`].
pub const AUTH_FAILED: &str = "authentication failed: wrong key or unknown host (the target's log says which)";

/// What an initiator that predates mutual authentication is told by a target that requires it
/// of every host.
pub const MUTUAL_REQUIRED: &str =
    "authentication refused: this target requires mutual authentication (AUTH v2); upgrade rblk on this host";

/// Why AUTH failed: its Display is for the daemon's log and `--check-config`; initiators get
/// [`AuthError::public_text`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// The MAC does not prove the key it must.
    WrongKey {
        /// The host, if it named one.
        host: Option<String>,
    },
    /// Only known hosts (with their own keys) may connect, and this one is not known.
    UnknownHost(String),
    /// Only hosts' own keys are configured, and the initiator named no host.
    NoHostId,
    /// A known host without a key of its own, on a target without a shared key.
    NoKey(String),
    /// A v1 AUTH (no proof of the target, no binding to the connection) from a host that must
    /// use v2: everywhere (`require_mutual_auth` at the top of the config) or this host.
    MutualRequired {
        /// The host, if it named one.
        host: Option<String>,
        /// Required of every host, not only this one (so the refusal may say so).
        everywhere: bool,
    },
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::WrongKey { host: Some(h) } => write!(f, "authentication failed: wrong key for host {h}"),
            AuthError::WrongKey { host: None } => f.write_str("authentication failed: wrong key"),
            AuthError::UnknownHost(h) => {
                write!(f, "authentication failed: unknown host {h} (not in the target's hosts)")
            }
            AuthError::NoKey(h) => {
                write!(f, "authentication failed: host {h} has no key of its own and the target has no shared key")
            }
            AuthError::NoHostId => f.write_str(
                "authentication failed: this target knows hosts by name and key only, and the initiator sent no host \
                 identity (it predates host identities)",
            ),
            AuthError::MutualRequired { host, everywhere } => write!(
                f,
                "authentication refused: host {} sent a v1 AUTH, and {} requires mutual authentication (an rblk \
                 from before it cannot log in)",
                who(host),
                if *everywhere { "this target" } else { "its [[host]] entry" }
            ),
        }
    }
}

impl AuthError {
    /// The ERROR text for the initiator: [`AUTH_FAILED`], whatever the reason, except
    /// [`AuthError::NoHostId`]. That one depends only on the target's configuration (no shared
    /// key) and on the initiator naming no host, so it says nothing about whether any host is
    /// known, and an initiator from before host identities learns what to change.
    pub fn public_text(&self) -> &'static str {
        match self {
            AuthError::WrongKey { .. }
            | AuthError::UnknownHost(_)
            | AuthError::NoKey(_)
            | AuthError::MutualRequired { everywhere: false, .. } => AUTH_FAILED,
            // Depends only on the target's configuration: it tells nothing about any host.
            AuthError::MutualRequired { everywhere: true, .. } => MUTUAL_REQUIRED,
            AuthError::NoHostId => {
                "authentication failed: this target knows hosts by name and key only, and the initiator sent no host \
                 identity (it predates host identities)"
            }
        }
    }
}

/// Keys and access lists (see the module docs).
#[derive(Default)]
pub struct Policy {
    shared_key: Option<Vec<u8>>,
    hosts: HashMap<String, Option<Vec<u8>>>,
    acls: HashMap<String, Acl>,
    /// Every host must use AUTH v2.
    mutual_everywhere: bool,
    /// These hosts must.
    mutual_hosts: HashSet<String>,
}

// Never print a key.
impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("shared_key", &self.shared_key.as_ref().map(|_| "<redacted>"))
            .field("hosts", &self.hosts.keys().collect::<Vec<_>>())
            .field("acls", &self.acls)
            .field("mutual_everywhere", &self.mutual_everywhere)
            .field("mutual_hosts", &self.mutual_hosts)
            .finish()
    }
}

impl Policy {
    /// Checks and builds the policy: host names valid and unique, access lists only for
    /// `volumes`, naming valid hosts.
    pub fn new(
        shared_key: Option<Vec<u8>>,
        hosts: &[HostSpec],
        acls: HashMap<String, Acl>,
        volumes: &[&str],
    ) -> Result<Policy, PolicyError> {
        let mut known = HashMap::new();
        for h in hosts {
            if !rblk_proto::is_valid_host_id(&h.name) {
                return Err(PolicyError::BadHostName(h.name.clone()));
            }
            if known.insert(h.name.clone(), h.key.clone()).is_some() {
                return Err(PolicyError::DuplicateHost(h.name.clone()));
            }
        }
        for (volume, acl) in &acls {
            if !volumes.contains(&volume.as_str()) {
                return Err(PolicyError::UnknownVolume(volume.clone()));
            }
            if let Some(bad) = acl.keys().find(|h| *h != ANY_HOST && !rblk_proto::is_valid_host_id(h)) {
                return Err(PolicyError::BadAclEntry { volume: volume.clone(), entry: bad.clone() });
            }
        }
        let mutual_hosts = hosts.iter().filter(|h| h.require_mutual_auth).map(|h| h.name.clone()).collect();
        Ok(Policy { shared_key, hosts: known, acls, mutual_everywhere: false, mutual_hosts })
    }

    /// Requires AUTH v2 of every host (`require_mutual_auth` at the top of the config).
    pub fn require_mutual_auth(&mut self, everywhere: bool) {
        self.mutual_everywhere = everywhere;
    }

    /// Whether `host` (None: anonymous) must use AUTH v2.
    pub fn mutual_required(&self, host: Option<&str>) -> bool {
        self.mutual_everywhere || host.is_some_and(|h| self.mutual_hosts.contains(h))
    }

    /// The access list of `volume`, if it has one.
    pub fn acl(&self, volume: &str) -> Option<&Acl> {
        self.acls.get(volume)
    }

    /// Gives `volume` (served, though no longer configured: a reload keeps it while it is
    /// open) the access list it had, so that keeping it opens it to nobody new.
    pub fn keep_acl(&mut self, volume: &str, acl: Option<Acl>) {
        match acl {
            Some(acl) => self.acls.insert(volume.to_owned(), acl),
            None => self.acls.remove(volume),
        };
    }

    /// Whether initiators must AUTH (some key is configured).
    pub fn auth_required(&self) -> bool {
        self.shared_key.is_some() || self.hosts.values().any(Option::is_some)
    }

    /// The key `host` (None: anonymous) must prove: Ok(None) when no key is configured at all
    /// (the name is taken as claimed), an error when it can never get in. The one rule for
    /// [`authenticate`](Self::authenticate) and [`can_log_in`](Self::can_log_in).
    fn key_for(&self, host: Option<&str>) -> Result<Option<&[u8]>, AuthError> {
        match host {
            Some(h) => match (self.hosts.get(h), &self.shared_key) {
                (Some(Some(own)), _) => Ok(Some(own)),
                (_, Some(shared)) => Ok(Some(shared)),
                // No key anywhere: the name is taken as claimed.
                _ if !self.auth_required() => Ok(None),
                (Some(None), None) => Err(AuthError::NoKey(h.to_owned())),
                (None, None) => Err(AuthError::UnknownHost(h.to_owned())),
            },
            None => match &self.shared_key {
                Some(shared) => Ok(Some(shared)),
                None if !self.auth_required() => Ok(None),
                None => Err(AuthError::NoHostId),
            },
        }
    }

    /// Whether an initiator calling itself `host` can ever authenticate here (with the right
    /// key): `--check-config` finds access lists naming hosts that never can.
    pub fn can_log_in(&self, host: &str) -> Result<(), AuthError> {
        self.key_for(Some(host)).map(drop)
    }

    /// Checks AUTH: `mac` over `nonce` (and `host`, if the initiator named one).
    pub fn authenticate(
        &self,
        nonce: &[u8; NONCE_LEN],
        mac: &[u8; MAC_LEN],
        host: Option<&str>,
    ) -> Result<(), AuthError> {
        let key = self.key_for(host).inspect_err(|_| {
            // As much work as a wrong key, so that the time to the answer does not tell either.
            rblk_proto::verify_auth_mac(&[0; 32], nonce, host, mac);
        })?;
        if key.is_some() && self.mutual_required(host) {
            return Err(AuthError::MutualRequired {
                host: host.map(str::to_owned),
                everywhere: self.mutual_everywhere,
            });
        }
        match key {
            None => Ok(()),
            Some(key) if rblk_proto::verify_auth_mac(key, nonce, host, mac) => Ok(()),
            Some(_) => Err(AuthError::WrongKey { host: host.map(str::to_owned) }),
        }
    }

    /// Checks AUTH v2: `mac` over `transcript` under the key its host must prove, and returns
    /// the target's proof for [`Message::AuthProof`](rblk_proto::Message::AuthProof) (made only
    /// now, after the initiator proved the key). Err(None) when no key is configured at all:
    /// there is nothing to prove either way.
    pub fn authenticate_mutual(
        &self,
        transcript: &Transcript<'_>,
        mac: &[u8; MAC_LEN],
        target_id: &[u8; TARGET_ID_LEN],
    ) -> Result<[u8; MAC_LEN], Option<AuthError>> {
        use rblk_proto::Direction;
        let host = Some(transcript.host);
        let key = self.key_for(host).inspect_err(|_| {
            rblk_proto::verify_mutual_mac(&[0; 32], Direction::InitiatorToTarget, transcript, None, mac);
        })?;
        let Some(key) = key else { return Err(None) };
        if !rblk_proto::verify_mutual_mac(key, Direction::InitiatorToTarget, transcript, None, mac) {
            return Err(Some(AuthError::WrongKey { host: host.map(str::to_owned) }));
        }
        rblk_proto::mutual_mac(key, Direction::TargetToInitiator, transcript, Some(target_id))
            .ok_or(Some(AuthError::WrongKey { host: host.map(str::to_owned) }))
    }

    /// What an initiator calling itself `host` (None: anonymous) proves when it authenticates
    /// under this policy: the connection keeps it, and its session, for
    /// [`revokes`](Self::revokes).
    pub fn credential(&self, host: Option<&str>) -> Credential {
        Credential(self.key_for(host).ok().flatten().map(fingerprint), false)
    }

    /// Why a connection of `host` that proved `proven` (and the session it opened, `open`:
    /// volume and mode) may not go on under this policy, or None if it may: the key the host
    /// must prove now is another one, or there is none it can (a reload replaced or removed
    /// it, or keys were configured where there were none), or the access list no longer
    /// grants the open. A policy without any key revokes no key.
    pub fn revokes(&self, host: Option<&str>, proven: &Credential, open: Option<(&str, OpenMode)>) -> Option<Revoked> {
        let key_holds = match self.key_for(host) {
            Ok(None) => true,
            Ok(Some(key)) => proven.0.is_some_and(|p| bool::from(p.ct_eq(&fingerprint(key)))),
            Err(_) => false,
        };
        if !key_holds {
            return Some(Revoked::Key);
        }
        if proven.0.is_some() && !proven.1 && self.mutual_required(host) {
            return Some(Revoked::Mutual);
        }
        let (volume, mode) = open?;
        self.may_open(volume, host, mode).err().map(Revoked::Access)
    }

    /// Who may get in and open which of `volumes` under this policy, keys by fingerprint only:
    /// what a reload and `--check-config` compare ([`crate::access_changes`]).
    pub fn snapshot<'a>(&self, volumes: impl IntoIterator<Item = &'a str>) -> Access {
        let short = |key: &Vec<u8>| rblk_proto::to_hex(&fingerprint(key)[..8]);
        Access {
            shared_key: self.shared_key.as_ref().map(short),
            hosts: self.hosts.iter().map(|(h, key)| (h.clone(), key.as_ref().map(short))).collect(),
            volumes: volumes.into_iter().map(|v| (v.to_owned(), self.acls.get(v).cloned())).collect(),
            mutual: self
                .mutual_hosts
                .iter()
                .cloned()
                .chain(self.mutual_everywhere.then(|| ANY_HOST.to_owned()))
                .collect(),
        }
    }

    /// Whether `host` (None: anonymous) may open `volume` in `mode`.
    pub fn may_open(&self, volume: &str, host: Option<&str>, mode: OpenMode) -> Result<(), AccessError> {
        let Some(acl) = self.acls.get(volume) else { return Ok(()) };
        let grant = host.and_then(|h| acl.get(h)).or_else(|| acl.get(ANY_HOST));
        let (host, volume) = (host.map(str::to_owned), volume.to_owned());
        match grant {
            Some(g) if g.permits(mode) => Ok(()),
            Some(&grant) => Err(AccessError::Mode { host, volume, mode, grant }),
            None => Err(AccessError::NotListed { host, volume }),
        }
    }
}

/// What a connection proved at AUTH: a fingerprint of the key ([`fingerprint`]); none where
/// the target had no key (names taken as claimed).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Credential(Option<[u8; 32]>, bool);

impl Credential {
    /// Nothing proven: the target had no key.
    pub const NONE: Credential = Credential(None, false);

    /// The same proven with AUTH v2 (which a reload that turns `require_mutual_auth` on keeps).
    pub fn mutual(self) -> Credential {
        Credential(self.0, true)
    }
}

// A fingerprint is not a key, but it need not be in logs either.
impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "Credential(a key)" } else { "Credential(none)" })
    }
}

/// A key's fingerprint: HMAC-SHA256 under the key of a fixed label. It tells keys apart (a
/// reload compares them) without holding or showing the key.
pub fn fingerprint(key: &[u8]) -> [u8; 32] {
    use hmac::Mac as _;
    let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(b"rblk key fingerprint");
    m.finalize().into_bytes().into()
}

/// Why a reload ends a session (see [`Policy::revokes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Revoked {
    /// The key its connection proved is not the one its host must prove now.
    Key,
    /// The access list no longer grants its open.
    Access(AccessError),
    /// It authenticated with v1, and its host must now use v2 (`require_mutual_auth`).
    Mutual,
}

impl fmt::Display for Revoked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Revoked::Key => f.write_str("the key it authenticated with is no longer the one its host must prove"),
            Revoked::Access(e) => e.fmt(f),
            Revoked::Mutual => f.write_str("it authenticated with v1, and its host must now use mutual authentication"),
        }
    }
}

fn mode_name(mode: OpenMode) -> &'static str {
    match mode {
        OpenMode::ReadOnly => "read-only",
        OpenMode::ReadWrite => "read-write",
        OpenMode::Exclusive => "exclusively",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONCE: [u8; NONCE_LEN] = [9; NONCE_LEN];

    fn mac(key: &[u8], host: Option<&str>) -> [u8; MAC_LEN] {
        rblk_proto::auth_mac(key, &NONCE, host).unwrap()
    }

    fn policy(shared: Option<&[u8]>) -> Policy {
        let hosts = [
            HostSpec { name: "db1".into(), key: Some(b"db1-key".to_vec()), ..HostSpec::default() },
            HostSpec { name: "web".into(), key: None, ..HostSpec::default() },
        ];
        let acl: Acl = [("db1".to_owned(), Grant::Exclusive), ("web".to_owned(), Grant::ReadOnly)].into();
        let open: Acl = [("*".to_owned(), Grant::ReadWrite)].into();
        let acls = [("db".to_owned(), acl), ("scratch".to_owned(), open)].into();
        Policy::new(shared.map(<[u8]>::to_vec), &hosts, acls, &["db", "scratch", "free"]).unwrap()
    }

    #[test]
    fn keys() {
        let p = policy(Some(b"shared"));
        assert!(p.auth_required());
        assert_eq!(p.authenticate(&NONCE, &mac(b"db1-key", Some("db1")), Some("db1")), Ok(()));
        // A host with its own key may not use the shared one.
        assert!(p.authenticate(&NONCE, &mac(b"shared", Some("db1")), Some("db1")).is_err());
        // Others (known without a key, or unknown) and anonymous initiators use the shared key.
        assert_eq!(p.authenticate(&NONCE, &mac(b"shared", Some("web")), Some("web")), Ok(()));
        assert_eq!(p.authenticate(&NONCE, &mac(b"shared", Some("other")), Some("other")), Ok(()));
        assert_eq!(p.authenticate(&NONCE, &mac(b"shared", None), None), Ok(()));
        // The MAC binds the name: db1's proof does not pass for web.
        assert!(p.authenticate(&NONCE, &mac(b"db1-key", Some("db1")), Some("web")).is_err());
        // Or the nonce: a replay from another connection fails.
        let other = rblk_proto::auth_mac(b"db1-key", &[1; NONCE_LEN], Some("db1")).unwrap();
        assert!(p.authenticate(&NONCE, &other, Some("db1")).is_err());

        let hosts_only = policy(None);
        assert!(hosts_only.auth_required());
        assert_eq!(
            hosts_only.authenticate(&NONCE, &mac(b"x", Some("new")), Some("new")),
            Err(AuthError::UnknownHost("new".into()))
        );
        assert_eq!(hosts_only.authenticate(&NONCE, &mac(b"x", None), None), Err(AuthError::NoHostId));
        assert_eq!(hosts_only.authenticate(&NONCE, &[0; MAC_LEN], Some("web")), Err(AuthError::NoKey("web".into())));
        assert!(matches!(hosts_only.authenticate(&NONCE, &[0; MAC_LEN], Some("db1")), Err(AuthError::WrongKey { .. })));

        let open = Policy::new(None, &[], HashMap::new(), &[]).unwrap();
        assert!(!open.auth_required());
        assert_eq!(open.authenticate(&NONCE, &[0; MAC_LEN], Some("anyone")), Ok(()), "claimed");
    }

    #[test]
    fn access_lists() {
        let p = policy(None);
        assert_eq!(p.may_open("db", Some("db1"), OpenMode::Exclusive), Ok(()));
        assert_eq!(p.may_open("db", Some("web"), OpenMode::ReadOnly), Ok(()));
        let e = p.may_open("db", Some("web"), OpenMode::Exclusive).unwrap_err().to_string();
        assert!(e.contains("may not open volume db exclusively") && e.contains("grants ro"), "{e}");
        assert!(p.may_open("db", Some("web"), OpenMode::ReadWrite).is_err());
        assert!(p
            .may_open("db", Some("other"), OpenMode::ReadOnly)
            .unwrap_err()
            .to_string()
            .contains("not on volume db's access list"));
        assert!(p.may_open("db", None, OpenMode::ReadOnly).unwrap_err().to_string().contains("anonymous"));
        assert_eq!(p.may_open("scratch", Some("anyone"), OpenMode::ReadWrite), Ok(()), "*");
        assert!(p.may_open("scratch", None, OpenMode::Exclusive).is_err());
        assert_eq!(p.may_open("free", None, OpenMode::Exclusive), Ok(()), "no list: open to all");
    }

    /// Would catch a session kept after its host's key was replaced or removed (or after keys
    /// were configured on an open target), one released though nothing it relied on changed
    /// (its key the same, or authentication turned off), and access lists not rechecked.
    #[test]
    fn what_a_new_policy_revokes() {
        let before = policy(Some(b"shared"));
        let (db1, web, anon) =
            (before.credential(Some("db1")), before.credential(Some("web")), before.credential(None));
        assert_ne!(db1, web, "own and shared keys differ");
        assert_eq!(web, anon, "both prove the shared key");
        let ro = Some(("db", OpenMode::ReadOnly));
        assert_eq!(before.revokes(Some("db1"), &db1, Some(("db", OpenMode::Exclusive))), None);
        assert_eq!(before.revokes(Some("web"), &web, ro), None);
        assert_eq!(policy(Some(b"shared")).revokes(Some("db1"), &db1, None), None, "the same keys again");

        let hosts = |db1_key: Option<&[u8]>| {
            [
                HostSpec { name: "db1".into(), key: db1_key.map(<[u8]>::to_vec), ..HostSpec::default() },
                HostSpec { name: "web".into(), key: None, ..HostSpec::default() },
            ]
        };
        let with = |shared: Option<&[u8]>, db1_key: Option<&[u8]>, acls: HashMap<String, Acl>| {
            Policy::new(shared.map(<[u8]>::to_vec), &hosts(db1_key), acls, &["db", "scratch", "free"]).unwrap()
        };
        let replaced = with(Some(b"shared"), Some(b"db1-new"), HashMap::new());
        assert_eq!(replaced.revokes(Some("db1"), &db1, None), Some(Revoked::Key), "db1's key replaced");
        assert_eq!(replaced.revokes(Some("web"), &web, None), None, "web's key is the same");
        let removed = with(Some(b"shared"), None, HashMap::new());
        assert_eq!(removed.revokes(Some("db1"), &db1, None), Some(Revoked::Key), "db1 proves the shared key now");
        let no_shared = with(None, Some(b"db1-key"), HashMap::new());
        assert_eq!(no_shared.revokes(None, &anon, None), Some(Revoked::Key), "anonymous can no longer log in");
        assert_eq!(no_shared.revokes(Some("db1"), &db1, None), None);

        let open = Policy::new(None, &[], HashMap::new(), &["db"]).unwrap();
        assert_eq!(open.revokes(Some("db1"), &db1, None), None, "authentication off takes nothing away");

        // require_mutual_auth turned on: v1 sessions go, v2 ones stay (would catch a v1 session
        // outliving the requirement, the relay's session among them).
        let mut mutual = policy(Some(b"shared"));
        mutual.require_mutual_auth(true);
        assert_eq!(mutual.revokes(Some("db1"), &db1, None), Some(Revoked::Mutual));
        assert_eq!(mutual.revokes(Some("db1"), &db1.mutual(), None), None);
        assert_eq!(before.revokes(Some("db1"), &open.credential(Some("db1")), None), Some(Revoked::Key), "keys on");

        let narrowed = with(
            Some(b"shared"),
            Some(b"db1-key"),
            [("db".to_owned(), [("web".to_owned(), Grant::ReadOnly)].into())].into(),
        );
        assert!(matches!(
            narrowed.revokes(Some("db1"), &db1, Some(("db", OpenMode::Exclusive))),
            Some(Revoked::Access(AccessError::NotListed { .. }))
        ));
        assert_eq!(narrowed.revokes(Some("db1"), &db1, Some(("free", OpenMode::Exclusive))), None, "other volumes");
        assert_eq!(narrowed.revokes(Some("web"), &web, ro), None);
        assert!(
            narrowed.revokes(Some("web"), &web, Some(("db", OpenMode::ReadWrite))).is_some(),
            "a mode no longer granted"
        );
    }

    #[test]
    fn bad_policies() {
        let h = |n: &str| HostSpec { name: n.into(), key: None, ..HostSpec::default() };
        let err = |r: Result<Policy, PolicyError>| r.map(drop).unwrap_err();
        assert_eq!(err(Policy::new(None, &[h("a b")], HashMap::new(), &[])), PolicyError::BadHostName("a b".into()));
        assert_eq!(
            err(Policy::new(None, &[h("a"), h("a")], HashMap::new(), &[])),
            PolicyError::DuplicateHost("a".into())
        );
        let acl: Acl = [("a".to_owned(), Grant::ReadOnly)].into();
        let e = err(Policy::new(None, &[], [("nope".to_owned(), acl.clone())].into(), &["v"]));
        assert_eq!(e, PolicyError::UnknownVolume("nope".into()));
        let bad: Acl = [("x y".to_owned(), Grant::ReadOnly)].into();
        let e = err(Policy::new(None, &[], [("v".to_owned(), bad)].into(), &["v"]));
        assert_eq!(e, PolicyError::BadAclEntry { volume: "v".into(), entry: "x y".into() });
        assert_eq!("rw".parse(), Ok(Grant::ReadWrite));
        assert_eq!("write".parse::<Grant>(), Err(BadGrant("write".into())));
        assert!(format!("{:?}", HostSpec { name: "a".into(), key: Some(b"s3cret".to_vec()), ..HostSpec::default() })
            .contains("redacted"));
    }
}
