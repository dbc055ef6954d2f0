//! The pool's events (see [`crate::events`]) and where they are recorded:
//! a key leaves the index through [`BlockPool::drop_key`], which reports
//! it.

use super::{BlockPool, NO_KEY};
use crate::events::{KvEvent, Medium, StoredBlocks};
use crate::ids::{BlockId, GroupId};

impl BlockPool {
    /// Drain the recorded events (empty when events are disabled).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events_done = 0;
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Whether events are being recorded.
    pub fn events_enabled(&self) -> bool {
        self.events.is_some()
    }

    /// The medium the events report ([`Medium::Gpu`] unless set).
    pub fn event_medium(&self) -> Medium {
        self.medium
    }

    /// Report events of this pool as living on `medium` from now on.
    pub fn set_event_medium(&mut self, medium: Medium) {
        self.medium = medium;
    }

    /// Report group `g` as `g + base` from now on (events, key read-outs);
    /// keys inside the pool keep the caller's ids.
    pub fn set_group_base(&mut self, base: u32) {
        self.group_base = base;
    }

    /// The id group `group` is reported under (see [`Self::set_group_base`]).
    pub fn reported_group(&self, group: GroupId) -> GroupId {
        GroupId(group.0.saturating_add(self.group_base))
    }

    /// The `BlockStored` events recorded since the last call, for the
    /// caller to complete with what only it knows
    /// ([`StoredBlocks::complete`]: the request's tokens and extra keys, the
    /// group's spec); the coordinator calls this after every call that may
    /// cache blocks of one request. Empty when events are off.
    pub fn events_to_complete(&mut self) -> impl Iterator<Item = &mut StoredBlocks> + '_ {
        let (start, events) = match &mut self.events {
            Some(events) => {
                let start = self.events_done;
                self.events_done = events.len();
                (start, &mut events[..])
            }
            None => (0, &mut [][..]),
        };
        events[start..].iter_mut().filter_map(|e| match e {
            KvEvent::BlockStored(s) => Some(&mut **s),
            _ => None,
        })
    }

    /// Remove `b`'s key, recording a `BlockRemoved` (vLLM reports every
    /// block that loses its key, even when others still hold the key).
    pub(super) fn drop_key(&mut self, b: BlockId) {
        let slot = std::mem::replace(&mut self.meta[b.index()].key, NO_KEY);
        if let Some(events) = &mut self.events {
            let key = self.index.key_at(slot);
            events.push(KvEvent::BlockRemoved {
                block_hash: key.hash,
                group: GroupId(key.group.0.saturating_add(self.group_base)),
                medium: self.medium,
            });
        }
        self.index.remove(slot, b);
        if let Some(e) = self.partial.take(b) {
            // Then its secondary keys, in insertion order.
            for (slot, _) in e.secondary {
                if let Some(events) = &mut self.events {
                    let key = self.index.key_at(slot);
                    events.push(KvEvent::BlockRemoved {
                        block_hash: key.hash,
                        group: GroupId(key.group.0.saturating_add(self.group_base)),
                        medium: self.medium,
                    });
                }
                self.index.remove(slot, b);
            }
        }
    }

    /// Remove every key of `b` without an event (undo of a refused call,
    /// copy-on-write moves).
    pub(super) fn unlink_key_silently(&mut self, b: BlockId) {
        let slot = std::mem::replace(&mut self.meta[b.index()].key, NO_KEY);
        self.index.remove(slot, b);
        if let Some(e) = self.partial.take(b) {
            for (slot, _) in e.secondary {
                self.index.remove(slot, b);
            }
        }
    }
}
