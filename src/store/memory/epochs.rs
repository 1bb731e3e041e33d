//! The lease generations of the subjects that leased, apart from the states so that
//! checks never pay for them.

use std::collections::HashMap;

/// One policy set's subjects: each one's generation and when it expires (ms).
type SubjectEpochs = HashMap<Box<[u8]>, (u64, u64)>;

/// Per policy set (fingerprint) and subject: the generation and when it expires (ms),
/// with the states it was made with. Generations are unique per store.
#[derive(Debug, Default)]
pub(super) struct Epochs {
    map: HashMap<u64, SubjectEpochs>,
    last: u64,
    /// Entries when expired ones were last dropped: they are dropped again once the
    /// map has doubled since.
    pruned_at_len: usize,
}

impl Epochs {
    /// The generation of `subject` under `set` at `now`, if it has one.
    pub(super) fn get(&self, set: u64, subject: &[u8], now: u64) -> Option<u64> {
        let &(epoch, expires) = self.map.get(&set)?.get(subject)?;
        (now < expires).then_some(epoch)
    }

    /// The generation of `subject` under `set`, made if it has none, kept until
    /// `expires`.
    pub(super) fn keep(&mut self, set: u64, subject: &[u8], now: u64, expires: u64) -> u64 {
        let epoch = match self.get(set, subject, now) {
            Some(epoch) => epoch,
            None => {
                self.last += 1;
                self.last
            }
        };
        let subjects = self.map.entry(set).or_default();
        match subjects.get_mut(subject) {
            Some(slot) => *slot = (epoch, expires.max(slot.1)),
            None => {
                subjects.insert(subject.into(), (epoch, expires));
            }
        }
        let len: usize = self.map.values().map(HashMap::len).sum();
        if len > 2 * self.pruned_at_len + 1_024 {
            for subjects in self.map.values_mut() {
                subjects.retain(|_, &mut (_, expires)| now < expires);
            }
            self.map.retain(|_, subjects| !subjects.is_empty());
            self.pruned_at_len = self.map.values().map(HashMap::len).sum();
        }
        epoch
    }

    pub(super) fn forget(&mut self, set: u64, subject: &[u8]) {
        if let Some(subjects) = self.map.get_mut(&set) {
            subjects.remove(subject);
        }
    }
}
