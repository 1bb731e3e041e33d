//! The Redis key layout (see [Keys](super#keys)): `<prefix>:{<subject>}:<set tag>:`
//! then `<policy name>:<algorithm code>` per policy, or `~` for a joint set's one key
//! (every policy's state in it), or `~lease` for the subject's lease generation.
//!
//! A scoped set (policies of several subjects) gives every key of a check one hash tag,
//! so that they share a cluster slot: the subject of its [tag
//! scope](PolicySet::tag_scope) (the org of a user-and-org check), else the key's.
//! A policy of another subject names it after the set tag: `+=<key>:` for the key's,
//! `+<scope>=<subject>:` for a named scope's (`+` is escaped inside subjects, and a
//! scope name is never empty, so no two subjects' keys meet). Global counters are
//! `<prefix>:{~}:<set tag>:<policy name>:<code>`: one key for everyone, in a slot of
//! its own.

use super::contract::code;
use crate::policy::Policy;
use crate::store::backend::PolicySet;
use crate::subject::{write_key_part_of, Subject, GLOBAL};

/// The Redis key that holds `subject`'s state for `policy` of `set`, under `prefix`
/// (a joint set's one key for each of its policies).
#[cfg(any(test, feature = "internals"))]
pub(super) fn key(prefix: &str, subject: &Subject, set: &PolicySet, policy: &Policy) -> String {
    let mut key = key_base(prefix, subject, set);
    if is_joint(set.policies(), set.is_scoped()) {
        key.push_str(JOINT_SUFFIX);
    } else {
        push_policy_suffix(&mut key, policy);
    }
    key
}

/// What follows the key base in a joint set's key: `~` is never in a policy name,
/// and the lease generation's is `~lease`.
pub(super) const JOINT_SUFFIX: &str = "~";

/// Whether a set keeps its policies' states in one key (lua/decide.lua's split): every
/// set of two or more policies of one subject, so a check reads and writes one key
/// where it would one a policy. Not a scoped set (its keys are of several subjects,
/// each counted by other sets too), nor one with an in-flight policy (its key goes
/// with its last holder, and a release names it alone).
pub(super) fn is_joint(policies: &[Policy], scoped: bool) -> bool {
    !scoped
        && policies.len() >= 2
        && policies
            .iter()
            .all(|p| p.algorithm() != crate::policy::Algorithm::InFlight)
}

/// `prefix:{subject}:<set tag>:`, the start of every key of one subject under one
/// policy set.
pub(super) fn key_base(prefix: &str, subject: &Subject, set: &PolicySet) -> String {
    let tag = set.key_tag();
    let mut key = String::with_capacity(prefix.len() + tag.len() + 48);
    key.push_str(prefix);
    key.push_str(":{");
    let start = key.len();
    subject.write_key_part(&mut key);
    if key.len() == start {
        // An empty hash tag would make Redis hash the whole key, spreading a
        // subject's policies over several slots. No escaped subject is a lone "%"
        // (escapes are "%XX"), so this stays unambiguous.
        key.push('%');
    }
    key.push_str("}:");
    key.push_str(tag);
    key.push(':');
    key
}

/// The key of a subject's lease generation, from its key base (`prefix:{subject}:`):
/// `~` is never in a policy name, so no policy's key is this one.
pub(super) fn lease_key_of(key_base: &str) -> String {
    let mut key = String::with_capacity(key_base.len() + 6);
    key.push_str(key_base);
    key.push_str("~lease");
    key
}

/// What follows a key base in a policy's key: `<policy name>:<algorithm code>`.
pub(super) fn policy_suffix(policy: &Policy) -> [&str; 3] {
    [policy.name(), ":", code(policy.algorithm())]
}

/// Appends [`policy_suffix`] to a key base.
pub(super) fn push_policy_suffix(key: &mut String, policy: &Policy) {
    for part in policy_suffix(policy) {
        key.push_str(part);
    }
}

/// The key of each policy of a scoped set for a check of `subject` (narrowed to the
/// set's scopes), in order.
pub(super) fn scoped_keys(prefix: &str, subject: &Subject, set: &PolicySet) -> Box<[String]> {
    let tag_part = match set.tag_scope() {
        Some(name) => subject.scope_part(name).unwrap_or(&[]),
        None => subject.key_part(),
    };
    set.policies()
        .iter()
        .map(|policy| {
            let part = set.part_of(policy, subject);
            let tag = if policy.scope().is_global() {
                GLOBAL
            } else {
                tag_part
            };
            let mut key = String::with_capacity(prefix.len() + 64);
            key.push_str(prefix);
            key.push_str(":{");
            let start = key.len();
            write_key_part_of(tag, &mut key);
            if key.len() == start {
                key.push('%');
            }
            key.push_str("}:");
            key.push_str(set.key_tag());
            key.push(':');
            let own = !policy.scope().is_global() && policy.scope().name() != set.tag_scope();
            if own {
                key.push('+');
                if let Some(name) = policy.scope().name() {
                    key.push_str(name);
                }
                key.push('=');
                write_key_part_of(part, &mut key);
                key.push(':');
            }
            push_policy_suffix(&mut key, policy);
            key
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use super::*;
    use crate::policy::Scope;

    /// No two (key, team, org) checks share a key unless their subjects for that
    /// policy are the same, whatever bytes the subjects hold; a check's keys share one
    /// hash tag, the org's.
    #[test]
    fn scoped_keys_never_meet_another_subjects() {
        let w = Duration::from_secs(60);
        let set = PolicySet::new(vec![
            Policy::fixed_window("k", 1, w).unwrap(),
            Policy::fixed_window("t", 1, w)
                .unwrap()
                .per(Scope::named("team").unwrap()),
            Policy::fixed_window("o", 1, w)
                .unwrap()
                .per(Scope::named("org").unwrap()),
            Policy::fixed_window("g", 1, w)
                .unwrap()
                .per(Scope::global()),
        ]);
        let values = [
            "", "a", "a:b", "+=a", "a}:{b", "%", "~", "=", "+org=x", "k:fw",
        ];
        // Each key and whose counter it is: (policy index, subject).
        let mut owner: HashMap<String, (usize, Vec<u8>)> = HashMap::new();
        for key in values {
            for team in values {
                for org in values {
                    let subject = Subject::new(key)
                        .within("team", &Subject::new(team))
                        .within("org", &Subject::new(org));
                    let keys = scoped_keys("rl", &subject, &set);
                    let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_owned();
                    assert_eq!(tag(&keys[0]), tag(&keys[1]));
                    assert_eq!(tag(&keys[0]), tag(&keys[2]));
                    for (i, k) in keys.iter().enumerate() {
                        let part = set.part_of(&set.policies()[i], &subject).to_vec();
                        // The key's and the team's counters are kept within their org.
                        let mine = if i < 2 {
                            (i, [org.as_bytes(), b"|", part.as_slice()].concat())
                        } else {
                            (i, part)
                        };
                        let previous = owner.entry(k.clone()).or_insert_with(|| mine.clone());
                        assert_eq!(*previous, mine, "{k}");
                    }
                }
            }
        }
    }
}
