//! What a reload changes about who may get in and open what: the [`Access`] before and after
//! (a reload's own, and `--check-config`'s against the running daemon, asked through the admin
//! socket), the [`AccessChange`]s between them, and which of those widen access.
//!
//! A reload takes access away at once: the sessions the new policy no longer admits are
//! released (see [`crate::access::Policy::revokes`]). It gives access only when asked to: a
//! configuration that widens it ([`AccessChange::widens`]) is refused unless the file itself
//! says `confirm_widen = true` (a SIGHUP carries no flags), so that a mistaken edit does not
//! open a closed target.

use std::fmt;

pub use crate::access::Access;
use crate::access::{Grant, ANY_HOST};

/// A key added, removed or replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyChange {
    /// There was none.
    Added,
    /// There is none now.
    Removed,
    /// Another one.
    Replaced,
}

impl KeyChange {
    fn between(old: Option<&String>, new: Option<&String>) -> Option<KeyChange> {
        match (old, new) {
            (None, Some(_)) => Some(KeyChange::Added),
            (Some(_), None) => Some(KeyChange::Removed),
            (Some(a), Some(b)) if a != b => Some(KeyChange::Replaced),
            _ => None,
        }
    }
}

impl fmt::Display for KeyChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyChange::Added => "added",
            KeyChange::Removed => "removed",
            KeyChange::Replaced => "replaced",
        })
    }
}

/// One change of who may get in or open what.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AccessChange {
    /// No key is left: every initiator gets in without one (`allow_any_host`). Widens.
    AuthOff,
    /// Keys are configured where there were none: initiators must prove one.
    AuthOn,
    /// The shared key.
    SharedKey(KeyChange),
    /// A `[[host]]` added.
    HostAdded(String),
    /// A `[[host]]` removed.
    HostRemoved(String),
    /// A host's own key.
    HostKey(String, KeyChange),
    /// A volume's access list removed: every host that gets in may open it. Widens.
    AllowDropped(String),
    /// A volume that had no access list has one.
    AllowAdded(String),
    /// Mutual authentication no longer required of this host (or `*`: of every host). Widens:
    /// a relay through an older initiator works again.
    MutualOff(String),
    /// Mutual authentication now required of this host (or `*`).
    MutualOn(String),
    /// An entry of a volume's access list: the host (or `*`), its grant before and after (None:
    /// not listed). Widens when `*` gains.
    Allow {
        /// The volume.
        volume: String,
        /// The host, or `*`.
        host: String,
        /// Its grant before.
        from: Option<Grant>,
        /// Its grant now.
        to: Option<Grant>,
    },
}

impl AccessChange {
    /// Whether it lets in or lets open someone the configuration did not name before:
    /// authentication off, an access list removed, `*` added to a list or granted more.
    pub fn widens(&self) -> bool {
        match self {
            AccessChange::AuthOff | AccessChange::AllowDropped(_) | AccessChange::MutualOff(_) => true,
            AccessChange::Allow { host, from, to, .. } => host == ANY_HOST && to > from,
            _ => false,
        }
    }
}

impl fmt::Display for AccessChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AccessChange::AuthOff => f.write_str("authentication off (no key left: any initiator gets in)"),
            AccessChange::AuthOn => f.write_str("authentication on"),
            AccessChange::SharedKey(c) => write!(f, "shared key {c}"),
            AccessChange::HostAdded(h) => write!(f, "host {h} added"),
            AccessChange::HostRemoved(h) => write!(f, "host {h} removed"),
            AccessChange::HostKey(h, c) => write!(f, "host {h}'s key {c}"),
            AccessChange::AllowDropped(v) => {
                write!(f, "volume {v}'s allow list removed (any host that gets in may open it)")
            }
            AccessChange::AllowAdded(v) => write!(f, "volume {v} has an allow list"),
            AccessChange::MutualOff(h) if h == ANY_HOST => {
                f.write_str("mutual authentication no longer required (v1 AUTH, relayable, accepted again)")
            }
            AccessChange::MutualOff(h) => write!(f, "host {h} no longer required to use mutual authentication"),
            AccessChange::MutualOn(h) if h == ANY_HOST => f.write_str("mutual authentication required of every host"),
            AccessChange::MutualOn(h) => write!(f, "host {h} required to use mutual authentication"),
            AccessChange::Allow { volume, host, from, to } => match (from, to) {
                (None, Some(to)) => write!(f, "volume {volume} allows {host} {to}"),
                (Some(from), None) => write!(f, "volume {volume} no longer allows {host} (was {from})"),
                (Some(from), Some(to)) => write!(f, "volume {volume} allows {host} {to} (was {from})"),
                (None, None) => write!(f, "volume {volume}: {host} unchanged"),
            },
        }
    }
}

/// What changed from `old` to `new`, in a stable order: authentication, keys, hosts, then each
/// volume both serve (an added or removed volume is no access change).
pub fn changes(old: &Access, new: &Access) -> Vec<AccessChange> {
    let mut out = Vec::new();
    match (old.auth_required(), new.auth_required()) {
        (true, false) => out.push(AccessChange::AuthOff),
        (false, true) => out.push(AccessChange::AuthOn),
        _ => {}
    }
    out.extend(KeyChange::between(old.shared_key.as_ref(), new.shared_key.as_ref()).map(AccessChange::SharedKey));
    for (host, key) in &old.hosts {
        match new.hosts.get(host) {
            None => out.push(AccessChange::HostRemoved(host.clone())),
            Some(now) => out
                .extend(KeyChange::between(key.as_ref(), now.as_ref()).map(|c| AccessChange::HostKey(host.clone(), c))),
        }
    }
    out.extend(new.hosts.keys().filter(|h| !old.hosts.contains_key(*h)).map(|h| AccessChange::HostAdded(h.clone())));
    // A host removed with its requirement is a host removal, not a widening of its own.
    out.extend(
        old.mutual
            .difference(&new.mutual)
            .filter(|h| *h == ANY_HOST || new.hosts.contains_key(*h))
            .map(|h| AccessChange::MutualOff(h.clone())),
    );
    out.extend(new.mutual.difference(&old.mutual).map(|h| AccessChange::MutualOn(h.clone())));
    for (volume, was) in &old.volumes {
        let Some(now) = new.volumes.get(volume) else { continue };
        match (was, now) {
            (Some(_), None) => out.push(AccessChange::AllowDropped(volume.clone())),
            (None, Some(_)) => out.push(AccessChange::AllowAdded(volume.clone())),
            (Some(was), Some(now)) => {
                let hosts: std::collections::BTreeSet<&String> = was.keys().chain(now.keys()).collect();
                for host in hosts {
                    let (from, to) = (was.get(host).copied(), now.get(host).copied());
                    if from != to {
                        out.push(AccessChange::Allow { volume: volume.clone(), host: host.clone(), from, to });
                    }
                }
            }
            (None, None) => {}
        }
    }
    out
}

/// A reload refused because it widens access and the file does not confirm it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the configuration widens access ({}): not applied; if that is meant, add confirm_widen = true to the \
     configuration file and reload again (and take it out afterwards)",
    describe(.0)
)]
pub struct Unconfirmed(pub Vec<AccessChange>);

/// The changes from `old` to `new`, unless some widen access and `confirm_widen` is not set.
pub fn check(old: &Access, new: &Access, confirm_widen: bool) -> Result<Vec<AccessChange>, Unconfirmed> {
    let all = changes(old, new);
    let widening: Vec<AccessChange> = all.iter().filter(|c| c.widens()).cloned().collect();
    if widening.is_empty() || confirm_widen {
        Ok(all)
    } else {
        Err(Unconfirmed(widening))
    }
}

/// The changes as one line for a log or a report.
pub fn describe(changes: &[AccessChange]) -> String {
    changes.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Acl;

    fn access(shared: Option<&str>, hosts: &[(&str, Option<&str>)], volumes: &[(&str, Option<Acl>)]) -> Access {
        Access {
            shared_key: shared.map(str::to_owned),
            hosts: hosts.iter().map(|(h, k)| ((*h).to_owned(), k.map(str::to_owned))).collect(),
            volumes: volumes.iter().map(|(v, a)| ((*v).to_owned(), a.clone())).collect(),
            mutual: Default::default(),
        }
    }

    fn acl(entries: &[(&str, Grant)]) -> Option<Acl> {
        Some(entries.iter().map(|(h, g)| ((*h).to_owned(), *g)).collect())
    }

    /// Would catch a change left out of the report, a narrowing taken for a widening (a host
    /// removed from a list, a key replaced) or a widening missed (authentication off, a list
    /// dropped, `*` added or raised), and added or removed volumes counted as access changes.
    #[test]
    fn changes_and_what_widens() {
        let old = access(
            Some("aa"),
            &[("db1", Some("11")), ("web", None)],
            &[("db", acl(&[("db1", Grant::Exclusive)])), ("pub", acl(&[("*", Grant::ReadOnly)])), ("free", None)],
        );
        assert_eq!(changes(&old, &old), []);
        let new = access(
            Some("bb"),
            &[("db1", Some("22")), ("app", None)],
            &[("db", acl(&[("db1", Grant::ReadOnly), ("web", Grant::ReadOnly)])), ("pub", None), ("free", None)],
        );
        let got = changes(&old, &new);
        assert_eq!(
            got,
            [
                AccessChange::SharedKey(KeyChange::Replaced),
                AccessChange::HostKey("db1".into(), KeyChange::Replaced),
                AccessChange::HostRemoved("web".into()),
                AccessChange::HostAdded("app".into()),
                AccessChange::Allow {
                    volume: "db".into(),
                    host: "db1".into(),
                    from: Some(Grant::Exclusive),
                    to: Some(Grant::ReadOnly)
                },
                AccessChange::Allow { volume: "db".into(), host: "web".into(), from: None, to: Some(Grant::ReadOnly) },
                AccessChange::AllowDropped("pub".into()),
            ]
        );
        assert_eq!(got.iter().filter(|c| c.widens()).collect::<Vec<_>>(), [&AccessChange::AllowDropped("pub".into())]);
        let e = check(&old, &new, false).unwrap_err().to_string();
        assert!(e.contains("volume pub's allow list removed") && e.contains("confirm_widen = true"), "{e}");
        assert_eq!(check(&old, &new, true).unwrap(), got, "confirmed");

        let open = access(None, &[("db1", None)], &[("db", acl(&[("db1", Grant::Exclusive), ("*", Grant::ReadOnly)]))]);
        let got = changes(&old, &open);
        assert_eq!(got[0], AccessChange::AuthOff);
        assert!(got.iter().any(|c| matches!(c, AccessChange::Allow { host, .. } if host == "*") && c.widens()));
        // Volumes added or removed are no access change.
        let fewer = access(Some("aa"), &[("db1", Some("11")), ("web", None)], &[("new", None)]);
        assert_eq!(changes(&old, &fewer), []);
        assert_eq!(changes(&open, &old)[0], AccessChange::AuthOn);

        // Mutual authentication required no longer widens (v1, relayable, comes back); newly
        // required does not; a host removed with its requirement is only a removal.
        let required = Access { mutual: ["*".to_owned(), "db1".to_owned(), "web".to_owned()].into(), ..old.clone() };
        let got = changes(&required, &old);
        assert_eq!(
            got,
            [
                AccessChange::MutualOff("*".into()),
                AccessChange::MutualOff("db1".into()),
                AccessChange::MutualOff("web".into())
            ]
        );
        assert!(got.iter().all(AccessChange::widens));
        assert!(changes(&old, &required).iter().all(|c| matches!(c, AccessChange::MutualOn(_)) && !c.widens()));
        let without_web = Access { hosts: [("db1".to_owned(), Some("11".to_owned()))].into(), ..old.clone() };
        assert!(!changes(&required, &without_web).contains(&AccessChange::MutualOff("web".into())));
    }
}
