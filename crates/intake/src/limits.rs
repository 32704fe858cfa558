//! How large one batch may be.

/// The most one batch may hold. A batch over either limit is refused whole, before any of it
/// is decoded, so that one request cannot hold the intake's workers for long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    /// Transactions in one batch.
    pub max_txs: usize,
    /// Bytes of raw transactions in one batch (their sum).
    pub max_bytes: usize,
}

impl Default for BatchLimits {
    /// 10,000 transactions and 16 MiB. A request that reaches the intake over JSON-RPC is
    /// bounded first by the server's `--rpc.max-request-size` (hex text, two characters a byte).
    fn default() -> Self {
        Self {
            max_txs: 10_000,
            max_bytes: 16 * 1024 * 1024,
        }
    }
}

/// Why a batch was refused whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// More transactions than [`BatchLimits::max_txs`].
    #[error("batch of {count} transactions exceeds the limit of {max}")]
    TooManyTransactions {
        /// Transactions in the batch.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// More bytes than [`BatchLimits::max_bytes`].
    #[error("batch of {bytes} bytes exceeds the limit of {max} bytes")]
    TooManyBytes {
        /// Bytes in the batch.
        bytes: usize,
        /// The limit.
        max: usize,
    },
}

impl BatchLimits {
    /// Checks a batch given the length of each raw transaction in it.
    pub fn check(&self, lengths: impl ExactSizeIterator<Item = usize>) -> Result<(), BatchError> {
        let count = lengths.len();
        if count > self.max_txs {
            return Err(BatchError::TooManyTransactions {
                count,
                max: self.max_txs,
            });
        }
        let bytes: usize = lengths.sum();
        if bytes > self.max_bytes {
            return Err(BatchError::TooManyBytes {
                bytes,
                max: self.max_bytes,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_inclusive_and_say_which_was_passed() {
        let limits = BatchLimits {
            max_txs: 3,
            max_bytes: 100,
        };
        assert_eq!(limits.check([40, 30, 30].into_iter()), Ok(()));
        assert_eq!(limits.check(std::iter::empty()), Ok(()));
        assert_eq!(
            limits.check([1, 1, 1, 1].into_iter()),
            Err(BatchError::TooManyTransactions { count: 4, max: 3 })
        );
        let err = limits.check([50, 51].into_iter()).unwrap_err();
        assert_eq!(
            err,
            BatchError::TooManyBytes {
                bytes: 101,
                max: 100
            }
        );
        assert_eq!(
            err.to_string(),
            "batch of 101 bytes exceeds the limit of 100 bytes"
        );
    }
}
