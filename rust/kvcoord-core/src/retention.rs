//! Validation of the prefix-cache retention interval.
//!
//! Sliding-window and Mamba groups only need a few blocks near a prefix
//! boundary to serve a hit, so they may cache sparsely: `None` caches densely,
//! `0` keeps only the latest boundary, `R > 0` keeps one boundary every `R`
//! tokens. Full-attention-only models have nothing to thin out.

use crate::error::{KvError, KvResult};

/// Check a retention interval against the model's layout.
///
/// * `None` (dense caching) is always accepted.
/// * Without sliding-window or Mamba groups only `0` is accepted.
/// * Otherwise the value must be non-negative and a multiple of the
///   scheduler block size.
pub fn validate_retention_interval(
    interval: Option<i64>,
    scheduler_block_size: u32,
    has_sparse_groups: bool,
) -> KvResult<()> {
    let Some(value) = interval else { return Ok(()) };
    let fail = |rule: String| KvError::InvalidConfig {
        name: "prefix_cache_retention_interval",
        value: value.to_string(),
        rule,
    };
    if scheduler_block_size == 0 {
        return Err(KvError::InvalidConfig {
            name: "scheduler_block_size",
            value: "0".into(),
            rule: "must be positive".into(),
        });
    }
    if !has_sparse_groups {
        return if value == 0 {
            Ok(())
        } else {
            Err(fail(
                "the model has no sliding-window or Mamba KV cache group, so only 0 (or None) \
                 is accepted"
                    .into(),
            ))
        };
    }
    if value < 0 {
        return Err(fail("must be non-negative".into()));
    }
    if value % i64::from(scheduler_block_size) != 0 {
        return Err(fail(format!(
            "must be a multiple of scheduler_block_size ({scheduler_block_size})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        assert!(validate_retention_interval(None, 32, false).is_ok());
        assert!(validate_retention_interval(None, 32, true).is_ok());
        assert!(validate_retention_interval(Some(0), 32, false).is_ok());
        assert!(validate_retention_interval(Some(32), 32, false).is_err());
        assert!(validate_retention_interval(Some(64), 32, true).is_ok());
        assert!(validate_retention_interval(Some(0), 32, true).is_ok());
        let e = validate_retention_interval(Some(33), 32, true).unwrap_err();
        assert!(
            e.to_string()
                .contains("multiple of scheduler_block_size (32)"),
            "{e}"
        );
        let e = validate_retention_interval(Some(-32), 32, true).unwrap_err();
        assert!(e.to_string().contains("non-negative"), "{e}");
        assert!(e.to_string().contains("=-32"), "{e}");
    }
}
