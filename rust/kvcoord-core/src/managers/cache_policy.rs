//! [`CachePolicy`]: what the coordinator tells a group's caching about
//! sparse caching (hit alignment, retention, the positions a later request
//! may resume from).

/// What the coordinator tells a group's `cache_blocks` about sparse caching.
#[derive(Clone, Debug)]
pub struct CachePolicy<'a> {
    /// Tokens a hit must end on a multiple of (the scheduler block size
    /// without partial hits).
    pub alignment: usize,
    /// Retention interval: `None` dense, `Some(0)` latest boundary only,
    /// `Some(r)` one boundary every `r` tokens.
    pub retention: Option<usize>,
    /// Token positions a later request may resume from (the prompt's replay
    /// boundary, a shared-prefix boundary); used only with a retention
    /// interval.
    pub reachable_boundaries: &'a [usize],
}
