//! The one error type of the core. Every fallible public operation checks its
//! whole input before changing anything, so an `Err` always means "nothing
//! happened". Panics are reserved for broken internal invariants (bugs).

use std::fmt;

use crate::ids::{BlockId, GroupId, ReqId};

/// Why a core operation refused its input.
// Not `#[non_exhaustive]`: the bindings match it exhaustively, so a new
// variant cannot ship without a Python exception class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvError {
    /// More blocks were requested than the free queue holds.
    OutOfBlocks {
        /// Blocks asked for.
        requested: usize,
        /// Blocks free at the time of the call.
        available: usize,
    },
    /// A block id is not below the pool size.
    BlockOutOfRange {
        /// The offending id.
        block: u64,
        /// Pool size.
        num_blocks: usize,
    },
    /// A free would drop a block's reference count below zero (double free,
    /// or a block that was never allocated).
    RefCountUnderflow(BlockId),
    /// A reference count would exceed `u32::MAX`.
    RefCountOverflow(BlockId),
    /// `cache_full_blocks` was asked to cache a block that already carries a
    /// cache key.
    AlreadyCached(BlockId),
    /// A release of blocks held by the caller outside every request table
    /// names a block the caller does not hold (that often).
    NotHeldByCaller(BlockId),
    /// A block hash has an unsupported length (16 and 32 bytes are accepted).
    InvalidHashLength(usize),
    /// A token id is negative or does not fit in 32 bits.
    InvalidTokenId {
        /// Index of the token in the sequence being validated.
        position: usize,
        /// The value as given.
        value: i128,
    },
    /// An argument is inconsistent with the others (for example
    /// `num_cached_blocks > num_full_blocks`).
    InvalidArgument {
        /// The argument's name.
        name: &'static str,
        /// What is wrong with it, with the values involved.
        detail: String,
    },
    /// The request, by its interned id, has no blocks in the coordinator
    /// (never allocated, or already freed).
    RequestWithoutBlocks(ReqId),
    /// A block id value from a caller is negative or does not fit the id
    /// type.
    InvalidBlockId {
        /// The value as given (`None`: too large to show as an integer).
        value: Option<i128>,
    },
    /// A block hash is not a bytes-like object of a supported length.
    InvalidHash {
        /// What was given instead.
        detail: String,
    },
    /// A structure's invariant does not hold (`check_invariants`): a bug.
    Invariant(String),
    /// No live request has this scheduler (string) id (never allocated, or
    /// freed).
    UnknownRequestId(String),
    /// A group id is not below the number of groups.
    UnknownGroup(GroupId),
    /// The operation is not supported for this kind of group (for example a
    /// prefix-cache lookup on a cross-attention or Mamba group).
    Unsupported {
        /// What was attempted, and on what.
        what: String,
    },
    /// A buffer sized by the caller could not be allocated (nothing was
    /// changed).
    OutOfMemory {
        /// What the buffer was for.
        what: &'static str,
        /// Bytes asked for.
        bytes: usize,
    },
    /// A configuration value breaks one of its rules.
    InvalidConfig {
        /// The setting's name.
        name: &'static str,
        /// The value as given.
        value: String,
        /// The rule it breaks.
        rule: String,
    },
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OutOfBlocks {
                requested,
                available,
            } => write!(
                f,
                "cannot get {requested} free blocks from the pool: only {available} are free"
            ),
            Self::BlockOutOfRange { block, num_blocks } => write!(
                f,
                "block id {block} is out of range for a pool of {num_blocks} blocks"
            ),
            Self::RefCountUnderflow(b) => write!(
                f,
                "block {b} holds no reference to release (double free, or never allocated)"
            ),
            Self::RefCountOverflow(b) => write!(f, "block {b}: reference count overflow"),
            Self::AlreadyCached(b) => write!(
                f,
                "block {b} is already in the prefix cache; num_cached_blocks is probably too small"
            ),
            Self::NotHeldByCaller(b) => write!(
                f,
                "block {b} is not held outside the request tables (only blocks taken with \
                 get_new_blocks and not yet freed are)"
            ),
            Self::InvalidHashLength(len) => write!(
                f,
                "block hash of {len} bytes: expected a 16-byte or 32-byte digest"
            ),
            Self::InvalidTokenId { position, value } => write!(
                f,
                "token id {value} at position {position} is invalid: token ids must be in [0, 2^32)"
            ),
            Self::InvalidArgument { name, detail } => write!(f, "invalid {name}: {detail}"),
            Self::RequestWithoutBlocks(r) => write!(f, "request {r} holds no blocks"),
            Self::InvalidBlockId { value: Some(v) } => write!(
                f,
                "block id {v} is invalid: {}",
                if *v < 0 {
                    "it is negative"
                } else {
                    "it does not fit in 32 bits"
                }
            ),
            Self::InvalidBlockId { value: None } => {
                write!(f, "block id is invalid: it does not fit in 32 bits")
            }
            Self::InvalidHash { detail } => write!(f, "invalid block hash: {detail}"),
            Self::Invariant(what) => write!(f, "invariant violated: {what}"),
            Self::UnknownRequestId(id) => {
                write!(f, "no request '{id}' in the KV cache manager")
            }
            Self::UnknownGroup(g) => write!(f, "no KV cache group {g}"),
            Self::Unsupported { what } => write!(f, "not supported: {what}"),
            Self::OutOfMemory { what, bytes } => {
                write!(f, "out of memory: cannot allocate {bytes} bytes for {what}")
            }
            Self::InvalidConfig { name, value, rule } => {
                write!(f, "invalid {name}={value}: {rule}")
            }
        }
    }
}

impl std::error::Error for KvError {}

/// Result alias used across the crate.
pub type KvResult<T> = Result<T, KvError>;
