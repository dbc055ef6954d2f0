//! KV-cache events: what a router needs to know about the prefix index.
//!
//! Recording is off by default; when on, the pool appends events as it
//! mutates the index and the caller drains them with `take_events`. The
//! events follow vLLM 0.33.0's `BlockPool` (`vllm/distributed/kv_events.py`
//! defines the wire types):
//!
//! * one [`KvEvent::BlockStored`] per `cache_full_blocks` call that had new
//!   full blocks (even when every block of the range was null or masked:
//!   then `block_hashes` is empty), listing the blocks it registered;
//! * one [`KvEvent::BlockRemoved`] per block that loses its cache key
//!   (reused by `get_new_blocks`, or dropped by `evict_blocks`), even when
//!   another block still holds the same key (vLLM reports every block);
//! * one [`KvEvent::AllBlocksCleared`] per successful `reset_prefix_cache`.
//!
//! The pool knows blocks and hashes, not requests: it records the token
//! *range* of a stored event, and the coordinator, which holds the request,
//! fills in the tokens, the `LoRA` name and the per-block extra keys
//! ([`StoredBlocks::complete`]) right after the call that cached them. A
//! pool driven directly (no request) leaves those empty.

use std::str::FromStr;

use crate::block_hash::BlockHash;
use crate::error::{KvError, KvResult};
use crate::hashing::ExtraKeys;
use crate::ids::{BlockId, GroupId};

/// Where the blocks of an event live (vLLM's `medium` strings).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Medium {
    /// Device memory (vLLM's `BlockPool` default).
    #[default]
    Gpu,
    /// Host memory (an offloading tier).
    Cpu,
    /// Disk or remote storage.
    Storage,
}

impl Medium {
    /// Every medium, in vLLM's order.
    pub const ALL: [Self; 3] = [Self::Gpu, Self::Cpu, Self::Storage];

    /// vLLM's spelling: `"GPU"`, `"CPU"`, `"STORAGE"` (what
    /// [`str::parse`] reads back).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Gpu => "GPU",
            Self::Cpu => "CPU",
            Self::Storage => "STORAGE",
        }
    }
}

impl FromStr for Medium {
    type Err = KvError;

    /// The medium spelt `s` exactly as [`Medium::as_str`] spells it; any
    /// other string is an [`KvError::InvalidArgument`] naming
    /// `event_medium` (the config field it sets).
    fn from_str(s: &str) -> KvResult<Self> {
        Self::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| KvError::InvalidArgument {
                name: "event_medium",
                detail: format!("\"GPU\", \"CPU\" or \"STORAGE\", not {s:?}"),
            })
    }
}

/// One extra key of a stored block as vLLM publishes it (untagged).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum EventExtraKey {
    /// A `LoRA` adapter name or a cache salt: a bare string.
    Text(String),
    /// A multimodal item overlapping the block: its identifier and its
    /// offset relative to the block start (negative when it began earlier).
    Mm(String, i64),
}

/// The payload of [`KvEvent::BlockStored`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredBlocks {
    /// Hashes of the blocks that were cached, in table order (null and
    /// masked blocks of the range are not listed).
    pub block_hashes: Vec<BlockHash>,
    /// Ids of those blocks, aligned with `block_hashes`.
    pub block_ids: Vec<BlockId>,
    /// Hash of the block before the range (position `first_block - 1`,
    /// whether or not that block is cached), `None` when the range starts
    /// at block 0.
    pub parent_block_hash: Option<BlockHash>,
    /// Position (in blocks of `block_size` tokens) of the range's first block.
    pub first_block: usize,
    /// Number of blocks in the range, skipped ones included.
    pub num_blocks: usize,
    /// Positions of the range's blocks that were skipped (null or masked),
    /// ascending; empty in the common case.
    pub skipped: Vec<u32>,
    /// Tokens per block of the group.
    pub block_size: u32,
    /// The group the blocks were cached for.
    pub group: GroupId,
    /// Where the blocks live.
    pub medium: Medium,
    /// The request's tokens of the whole range
    /// (`first_block * block_size .. (first_block + num_blocks) * block_size`),
    /// filled by [`StoredBlocks::complete`]; empty before.
    pub token_ids: Vec<u32>,
    /// The request's `LoRA` adapter name, filled by `complete`.
    pub lora_name: Option<String>,
    /// Per stored block, its extra keys (`None`: the block has none).
    /// Empty when no block has any (the common case, no allocation).
    pub extra_keys: Vec<Option<Vec<EventExtraKey>>>,
    /// The group's spec kind in vLLM's spelling (`"full_attention"`...),
    /// filled by `complete`.
    pub spec_kind: Option<&'static str>,
    /// The group's sliding window, when it has one; filled by `complete`.
    pub sliding_window: Option<u32>,
    /// Whether `complete` ran.
    pub completed: bool,
}

impl StoredBlocks {
    /// An event of `group` with no block and nothing completed yet.
    pub const fn new(group: GroupId, block_size: u32, medium: Medium) -> Self {
        Self {
            block_hashes: Vec::new(),
            block_ids: Vec::new(),
            parent_block_hash: None,
            first_block: 0,
            num_blocks: 0,
            skipped: Vec::new(),
            block_size,
            group,
            medium,
            token_ids: Vec::new(),
            lora_name: None,
            extra_keys: Vec::new(),
            spec_kind: None,
            sliding_window: None,
            completed: false,
        }
    }

    /// First token of the range.
    pub fn token_start(&self) -> usize {
        self.first_block * self.block_size as usize
    }

    /// Hashes of the stored blocks in vLLM's integer form
    /// ([`BlockHash::external`]).
    pub fn external_hashes(&self) -> impl Iterator<Item = u64> + '_ {
        self.block_hashes.iter().map(BlockHash::external)
    }

    /// Per stored block, its extra keys (`None`: it has none); `None` when
    /// no block was stored (vLLM publishes no extra keys then).
    pub fn extra_keys_per_block(
        &self,
    ) -> Option<impl Iterator<Item = Option<&[EventExtraKey]>> + '_> {
        let n = self.block_hashes.len();
        (n > 0).then(|| (0..n).map(|i| self.extra_keys.get(i).and_then(Option::as_deref)))
    }

    /// Positions (in blocks) of the stored blocks, aligned with `block_ids`.
    pub fn positions(&self) -> impl Iterator<Item = usize> + '_ {
        let range = self.first_block..self.first_block + self.num_blocks;
        let mut skipped = self.skipped.iter().peekable();
        range.filter(move |&p| {
            if skipped.peek().is_some_and(|&&s| s as usize == p) {
                skipped.next();
                false
            } else {
                true
            }
        })
    }

    /// Fill what the pool cannot know from the request that cached the
    /// blocks: its tokens of the range (clipped to the tokens it has), its
    /// `LoRA` name and every stored block's extra keys, and the group's
    /// spec as vLLM names it (`spec_kind`, `sliding_window`:
    /// [`SpecKind::event_metadata`](crate::SpecKind::event_metadata)).
    /// Idempotent.
    pub fn complete(
        &mut self,
        tokens: &[u32],
        extra: &ExtraKeys,
        (spec_kind, sliding_window): (&'static str, Option<u32>),
    ) {
        if self.completed {
            return;
        }
        self.completed = true;
        let bs = self.block_size as usize;
        let start = self.token_start().min(tokens.len());
        let end = (self.token_start() + self.num_blocks * bs).min(tokens.len());
        self.token_ids = tokens[start..end].to_vec();
        self.lora_name = extra.lora.as_ref().map(|l| l.name.clone());
        self.spec_kind = Some(spec_kind);
        self.sliding_window = sliding_window;
        if !extra.is_empty() {
            let mut mm_next = 0;
            let keys: Vec<_> = self
                .positions()
                .map(|p| block_extra_keys(extra, p * bs, (p + 1) * bs, &mut mm_next))
                .collect();
            self.extra_keys = keys;
        }
    }
}

/// One change to the prefix index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// One `cache_full_blocks` call registered these blocks.
    BlockStored(Box<StoredBlocks>),
    /// A block lost its cache key (it was evicted or reused).
    BlockRemoved {
        /// The removed key's hash.
        block_hash: BlockHash,
        /// The removed key's group.
        group: GroupId,
        /// Where the block lives.
        medium: Medium,
    },
    /// `reset_prefix_cache` dropped every key.
    AllBlocksCleared,
}

/// The extra keys vLLM publishes for the block `[start, end)`: the `LoRA`
/// name, then `(identifier, offset - start)` for every multimodal item the
/// block overlaps, then the cache salt (block 0 only). `mm_next` is the
/// resume index of the multimodal scan, starting at 0 for each event and
/// advanced as vLLM advances it (an item is passed once a block starts past
/// its end; the scan stops at the first item reaching `end` or beyond).
fn block_extra_keys(
    extra: &ExtraKeys,
    start: usize,
    end: usize,
    mm_next: &mut usize,
) -> Option<Vec<EventExtraKey>> {
    let mut keys = Vec::new();
    if let Some(l) = &extra.lora {
        keys.push(EventExtraKey::Text(l.name.clone()));
    }
    let items = &extra.mm_features;
    let (start64, end64) = (start as u64, end as u64);
    if items
        .last()
        .is_some_and(|f| u64::from(f.offset) + u64::from(f.length) >= start64)
    {
        let mut i = *mm_next;
        while let Some(f) = items.get(i) {
            let f_end = u64::from(f.offset) + u64::from(f.length);
            if end64 <= u64::from(f.offset) {
                break;
            }
            if start64 > f_end {
                i += 1;
                continue;
            }
            let rel = i64::from(f.offset) - i64::try_from(start).unwrap_or(i64::MAX);
            keys.push(EventExtraKey::Mm(f.identifier.clone(), rel));
            if end64 >= f_end {
                i += 1;
            } else {
                break;
            }
        }
        *mm_next = i;
    }
    if start == 0 {
        if let Some(s) = extra.cache_salt.as_deref().filter(|s| !s.is_empty()) {
            keys.push(EventExtraKey::Text(s.to_owned()));
        }
    }
    (!keys.is_empty()).then_some(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::{LoraKey, MmFeature};
    use crate::spec::SpecKind;

    fn stored(first_block: usize, num_blocks: usize, skipped: Vec<u32>) -> StoredBlocks {
        StoredBlocks {
            first_block,
            num_blocks,
            skipped,
            ..StoredBlocks::new(GroupId(0), 4, Medium::Gpu)
        }
    }

    #[test]
    fn medium_parses_what_it_prints() {
        for m in Medium::ALL {
            assert_eq!(m.as_str().parse::<Medium>(), Ok(m));
        }
        for bad in ["gpu", "", "GPU "] {
            let err = bad.parse::<Medium>().unwrap_err();
            assert!(
                matches!(
                    err,
                    KvError::InvalidArgument {
                        name: "event_medium",
                        ..
                    }
                ),
                "{err:?}"
            );
        }
    }

    #[test]
    fn positions_skip_the_skipped() {
        let s = stored(2, 4, vec![3, 5]);
        assert_eq!(s.positions().collect::<Vec<_>>(), vec![2, 4]);
        assert_eq!(stored(0, 2, vec![]).positions().count(), 2);
    }

    #[test]
    fn extra_keys_per_block_has_one_entry_per_stored_block() {
        let mut s = stored(0, 2, vec![]);
        assert!(s.extra_keys_per_block().is_none(), "no block stored");
        s.block_hashes = vec![BlockHash::from_slice(&[7; 32]).unwrap(); 2];
        let none: Vec<_> = s.extra_keys_per_block().unwrap().collect();
        assert_eq!(none, vec![None, None]);
        s.extra_keys = vec![None, Some(vec![EventExtraKey::Text("salt".into())])];
        let got: Vec<_> = s
            .extra_keys_per_block()
            .unwrap()
            .map(|k| k.map(<[_]>::len))
            .collect();
        assert_eq!(got, vec![None, Some(1)]);
        assert_eq!(s.external_hashes().count(), 2);
        assert_eq!(
            s.external_hashes().next(),
            Some(s.block_hashes[0].external())
        );
    }

    #[test]
    fn complete_fills_tokens_lora_salt_and_mm() {
        let tokens: Vec<u32> = (0..20).collect();
        let extra = ExtraKeys::new(
            Some(LoraKey {
                name: "ad".into(),
                path: "/p".into(),
            }),
            vec![MmFeature {
                identifier: "img".into(),
                offset: 2,
                length: 4,
            }],
            Some("salt".into()),
        );
        let mut s = stored(0, 3, vec![]);
        let window = SpecKind::SlidingWindow { sliding_window: 8 };
        s.complete(&tokens, &extra, window.event_metadata());
        assert_eq!(s.token_ids, (0..12).collect::<Vec<u32>>());
        assert_eq!(s.lora_name.as_deref(), Some("ad"));
        assert_eq!(s.spec_kind, Some("sliding_window"));
        assert_eq!(s.sliding_window, Some(8));
        let t = |x: &str| EventExtraKey::Text(x.into());
        assert_eq!(
            s.extra_keys,
            vec![
                Some(vec![t("ad"), EventExtraKey::Mm("img".into(), 2), t("salt")]),
                Some(vec![t("ad"), EventExtraKey::Mm("img".into(), -2)]),
                Some(vec![t("ad")]),
            ]
        );
        // Idempotent; and no extras means no per-block list at all.
        let full = SpecKind::FullAttention.event_metadata();
        s.complete(&[], &ExtraKeys::default(), full);
        assert_eq!(s.token_ids.len(), 12);
        let mut plain = stored(1, 2, vec![2]);
        plain.complete(&tokens[..10], &ExtraKeys::default(), full);
        assert_eq!(plain.token_ids, (4..10).collect::<Vec<u32>>());
        assert!(plain.extra_keys.is_empty());
        assert_eq!(plain.spec_kind, Some("full_attention"));
    }
}
