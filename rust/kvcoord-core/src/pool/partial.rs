//! Keys inside a block: partial keys at hash-unit boundaries (vLLM's
//! `cache_partial_block`), secondary keys, and moving a block's keys to a
//! copy of it.

use super::order::Order;
use super::{BlockPool, NO_KEY, WHOLE_BLOCK};
use crate::block_hash::BlockHash;
use crate::error::{KvError, KvResult};
use crate::events::{KvEvent, StoredBlocks};
use crate::ids::{BlockId, GroupId};
use crate::prefix_index::CacheKey;

impl BlockPool {
    /// Make `block` reachable from the hash-unit boundary at `num_tokens`
    /// (vLLM's `BlockPool.cache_partial_block`): the key is
    /// `(unit_hashes[num_tokens / hash_block_size - 1], group)`, the chained
    /// hash of the whole prefix up to that boundary, which may lie inside
    /// the block. `full_tokens` is the prefix a full-block key on `block`
    /// stands for (the end of the block at its table position).
    ///
    /// * `replace_existing`: the block's contents were replaced; every key
    ///   it has is removed (reported) first;
    /// * otherwise, a block whose primary key covers fewer tokens loses its
    ///   keys (reported) first, and the new key becomes the primary key of a
    ///   block without one, a secondary key of a block with one;
    /// * a `BlockStored` event of one hash unit is recorded unless the key
    ///   was already there.
    ///
    /// Returns the key, or `None` for the null block or with caching off.
    /// Refused (nothing changed) for an out-of-range block, a `num_tokens`
    /// that is not a positive multiple of the hash unit, or beyond the
    /// hashes given.
    pub fn cache_partial_block(
        &mut self,
        block: BlockId,
        unit_hashes: &[BlockHash],
        num_tokens: usize,
        full_tokens: usize,
        group: GroupId,
        replace_existing: bool,
    ) -> KvResult<Option<CacheKey>> {
        self.check_ids(&[block])?;
        let hbs = self.config.hash_block_size as usize;
        let units = num_tokens / hbs;
        if num_tokens == 0 || num_tokens % hbs != 0 || units > unit_hashes.len() {
            return Err(KvError::InvalidArgument {
                name: "num_tokens",
                detail: format!(
                    "{num_tokens} is not a positive multiple of the hash unit ({hbs}) \
                     within the {} hashes given",
                    unit_hashes.len()
                ),
            });
        }
        let tokens32 = u32::try_from(num_tokens).map_err(|_| KvError::InvalidArgument {
            name: "num_tokens",
            detail: format!("{num_tokens} does not fit 32 bits"),
        })?;
        if block.is_null() || !self.config.enable_caching {
            return Ok(None);
        }
        let key = CacheKey {
            hash: unit_hashes[units - 1],
            group,
        };
        let mut already = self.holds_key(block, &key);
        let primary = self.meta[block.index()].key;
        if replace_existing {
            if primary != NO_KEY {
                self.drop_key(block);
            }
            already = false;
        } else if !already && primary != NO_KEY {
            let covered = self
                .partial
                .primary_tokens(block)
                .map_or(full_tokens, |t| t as usize);
            if covered < num_tokens {
                self.drop_key(block);
            }
        }
        if !self.holds_key(block, &key) {
            let slot = self.index.insert(key, block);
            if self.meta[block.index()].key == NO_KEY {
                self.meta[block.index()].key = slot;
                self.key_tokens[block.index()] = tokens32;
                self.partial.set_primary_tokens(block, Some(tokens32));
                if let Order::Ranked(r) = &mut self.free {
                    let depth = u32::try_from(units).unwrap_or(u32::MAX);
                    r.policy.as_dyn_mut().on_cache(block, depth);
                }
            } else {
                self.partial.push_secondary(block, slot, tokens32);
            }
        }
        if !already {
            if let Some(events) = &mut self.events {
                events.push(KvEvent::BlockStored(Box::new(StoredBlocks {
                    block_hashes: vec![key.hash],
                    block_ids: vec![block],
                    parent_block_hash: units.checked_sub(2).map(|i| unit_hashes[i]),
                    first_block: units - 1,
                    num_blocks: 1,
                    ..StoredBlocks::new(
                        GroupId(group.0.saturating_add(self.group_base)),
                        self.config.hash_block_size,
                        self.medium,
                    )
                })));
            }
        }
        Ok(Some(key))
    }

    /// Put `block` in the prefix index under `key` by hand: what vLLM's pool
    /// does when a caller inserts a block into `cached_block_hash_to_block`
    /// or sets a block's hash (vLLM's `_insert_block_hash`). A no-op when the
    /// block already holds the key; otherwise the key becomes the block's
    /// primary key when it has none (`tokens`: the prefix it stands for when
    /// partial; `None`: the whole block), a secondary key when it has one.
    /// The block is listed after the blocks already under the key. Nothing
    /// else changes (reference count, free-queue position), and no event is
    /// recorded (vLLM's index edits record none; a later removal is reported
    /// as any other). Unlike the pool's own caching, which never keys the
    /// null block, this keys it too when asked, as vLLM's pool lets a caller
    /// do. Returns whether the key was added (false with caching off).
    ///
    /// Refused (nothing changed) for an out-of-range block and on a pool with
    /// a ranked eviction policy.
    pub fn insert_key(
        &mut self,
        block: BlockId,
        key: CacheKey,
        tokens: Option<u32>,
    ) -> KvResult<bool> {
        self.check_ids(&[block])?;
        if matches!(self.free, Order::Ranked(_)) {
            return Err(KvError::Unsupported {
                what: "insert_key on a pool with a ranked eviction policy".into(),
            });
        }
        if !self.config.enable_caching || self.holds_key(block, &key) {
            return Ok(false);
        }
        let slot = self.index.insert(key, block);
        if self.meta[block.index()].key == NO_KEY {
            self.meta[block.index()].key = slot;
            // vLLM's block_hash_num_tokens is what the caller gave (None
            // for a whole-block key inserted by hand).
            self.key_tokens[block.index()] = tokens.unwrap_or(WHOLE_BLOCK);
            self.partial.set_primary_tokens(block, tokens);
        } else {
            self.partial
                .push_secondary(block, slot, tokens.unwrap_or(WHOLE_BLOCK));
        }
        Ok(true)
    }

    /// Whether `block` is cached under `key` (as its primary or a secondary
    /// key).
    fn holds_key(&self, block: BlockId, key: &CacheKey) -> bool {
        self.meta[block.index()].key != NO_KEY
            && self
                .index
                .slot_of(key)
                .is_some_and(|s| self.index.slot_holds(s, block))
    }

    /// Copy-on-write: re-point every key of `src` to `dst` (vLLM's
    /// `BlockPool.move_block_hashes`). The request owning `src` keeps
    /// writing into it; the prefix cache holds the private copy `dst` under
    /// the same keys instead. `dst`'s first key (the old primary) keeps the
    /// token count of `src`'s primary key. No event (the keys stay live);
    /// a key shared with other blocks now lists `dst` last. A no-op when
    /// `src` has no key.
    ///
    /// Refused (nothing changed) for an out-of-range block, the null block,
    /// `src == dst`, or a `dst` that is cached.
    pub fn move_block_keys(&mut self, src: BlockId, dst: BlockId) -> KvResult<()> {
        self.check_ids(&[src, dst])?;
        let bad = |detail: &str| KvError::InvalidArgument {
            name: "dst",
            detail: detail.into(),
        };
        if src.is_null() || dst.is_null() {
            return Err(bad("the null block is never cached"));
        }
        if src == dst {
            return Err(bad("a block's keys cannot move to itself"));
        }
        if self.meta[dst.index()].key != NO_KEY {
            return Err(KvError::AlreadyCached(dst));
        }
        let primary = self.meta[src.index()].key;
        if primary == NO_KEY {
            return Ok(());
        }
        let primary_key = self.index.key_at(primary);
        let entry = self.partial.get(src).cloned().unwrap_or_default();
        let secondary: Vec<(CacheKey, u32)> = entry
            .secondary
            .iter()
            .map(|&(s, t)| (self.index.key_at(s), t))
            .collect();
        self.unlink_key_silently(src);
        self.meta[dst.index()].key = self.index.insert(primary_key, dst);
        self.key_tokens[dst.index()] = self.key_tokens[src.index()];
        self.partial.set_primary_tokens(dst, entry.primary_tokens);
        for (key, tokens) in secondary {
            let slot = self.index.insert(key, dst);
            self.partial.push_secondary(dst, slot, tokens);
        }
        Ok(())
    }
}
