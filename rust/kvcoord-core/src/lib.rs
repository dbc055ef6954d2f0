//! kvcoord-core: the KV-cache block manager of an LLM inference scheduler, as
//! plain Rust (no Python here; the bindings live in `kvcoord-py`).
//!
//! * [`BlockPool`]: per-block metadata in flat arrays (reference count, cache
//!   key slot: 16 bytes per block), the [`FreeQueue`] that orders reuse
//!   and eviction (a [`LinkedLists`] of `u32` links), and the [`PrefixIndex`]
//!   from `(block hash, group)` to cached blocks. Decisions follow vLLM
//!   0.33.0's `BlockPool` exactly (same ids, same eviction order).
//! * [`eviction`]: the order in which free blocks are reused, a policy
//!   chosen at construction (vLLM's LRU by default; LFU, prefix depth,
//!   priority with retention; any [`EvictionPolicy`]).
//! * [`managers`]: the per-group rules of each attention kind (full,
//!   sliding window, chunked local, Mamba "none", cross attention).
//! * [`CoordinatorCore`]: one pool, one manager per group and every
//!   request's block tables; `allocate_slots` / `free` / `cache_blocks` as
//!   vLLM's `KVCacheManager` does them, plus the per-spec hit finders.
//! * [`hashing`]: chained block hashes (vLLM's `sha256_cbor` and
//!   `xxhash_cbor`, byte-identical, plus a faster native format) and the
//!   incremental [`RequestHasher`]; [`cbor`] is the canonical CBOR encoder
//!   they use.
//! * [`validate_retention_interval`]: the prefix-cache retention rules.
//!
//! # Invariants
//!
//! Written on the fields they govern (`pool/mod.rs`, `linked_lists.rs`,
//! `prefix_index.rs`) and checked by `check_invariants()`, which the tests
//! call after every operation.
//!
//! # Layers
//!
//! The modules form no import cycle (`tools/check_module_cycles.py`, run by
//! `make lint` and the tests, fails on one). From the bottom: ids, errors,
//! [`limits`] and the hashes; [`spec`] (the kinds and their facts),
//! [`step_args`], [`request`], [`linked_lists`]; the [`pool`] with its free
//! queue, index and [`events`]; the per-kind [`managers`]; the
//! [`coordinator`], and [`decode`] and [`hisparse_pair`] (two coordinators,
//! one transaction per call) on top of it; [`router_index`] (a cluster
//! router's view, built from [`events`]) beside the pool; [`running_batch`]
//! (a replay's per-step arithmetic) on its own. Inside a folder, the files that
//! extend its main type (`impl CoordinatorCore`, `impl BlockPool`) import
//! its `mod.rs`, which never imports them; in `managers/` and `eviction/`, `mod.rs`
//! dispatches to the kinds and policies, which never import it.

pub mod best_case;
pub mod block_hash;
pub mod block_ids;
pub mod cbor;
pub mod coordinator;
pub mod decode;
pub mod error;
pub mod events;
pub mod eviction;
pub mod free_queue;
pub mod hashing;
pub mod hisparse_pair;
pub mod ids;
pub mod limits;
pub mod linked_lists;
pub mod managers;
mod partial_keys;
pub mod pool;
pub mod prefix_index;
pub mod request;
pub mod residency;
pub mod retention;
pub mod reuse_watch;
pub mod router_index;
pub mod running_batch;
pub mod sampled_lives;
pub mod spec;
pub mod step_args;
pub mod trace_tokens;

pub use best_case::UnboundedPrefixCache;
pub use block_hash::BlockHash;
pub use coordinator::{
    default_hash_block_size, scheduler_block_size, AllocateArgs, BoundaryOffload,
    CoordinatorConfig, CoordinatorCore, CoordinatorKind, NewBlocks, PredictArgs, RequestView,
};
pub use decode::DecodeRoom;
pub use error::{KvError, KvResult};
pub use events::KvEvent;
pub use eviction::{EvictionConfig, EvictionPolicy, LevelQueue};
pub use free_queue::FreeQueue;
pub use hashing::{ExtraKeys, HashAlgo, HashConfig, LoraKey, MmFeature, RequestHasher};
pub use hisparse_pair::HiSparsePair;
pub use ids::{BlockId, GroupId, ReqId};
pub use linked_lists::LinkedLists;
pub use managers::{GroupTable, Manager};
pub use pool::{BlockPool, PoolConfig};
pub use prefix_index::{CacheKey, PrefixIndex};
pub use request::{step_progress, Request, RequestRegistry, StepProgress, StepRequest};
pub use residency::{EvictionRecord, Histogram, Residency, ResidencySnapshot};
pub use retention::validate_retention_interval;
pub use router_index::RouterIndex;
pub use spec::{GroupSpec, HitSearch, KindFacts, NullEntries, SpecKind};
