pub mod bench;
pub mod chain;
pub mod ef_tests;
pub mod init;
pub mod load;
mod split;

/// Parses a count flag that must be at least 1 (threads, blocks, transactions): zero would
/// run nothing and report an empty measurement, so it is refused at the command line.
pub(crate) fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_string()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// The largest `--prefault-heap` accepted, in MiB (64 GiB): a typo of a few more digits would
/// otherwise ask the kernel for terabytes.
pub(crate) const MAX_PREFAULT_MIB: usize = 64 << 10;

/// Parses `--prefault-heap` (MiB; 0 turns it off).
pub(crate) fn prefault_mib(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > MAX_PREFAULT_MIB => Err(format!("must be at most {MAX_PREFAULT_MIB} MiB")),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// `n` and `noun`, with the noun in the plural unless `n` is one: "1 test", "2 tests".
pub(crate) fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_PREFAULT_MIB, count, positive, prefault_mib};

    #[test]
    fn counts_take_the_plural_unless_one() {
        assert_eq!(count(0, "test"), "0 tests");
        assert_eq!(count(1, "test"), "1 test");
        assert_eq!(count(2, "block"), "2 blocks");
    }

    #[test]
    fn positive_counts_only() {
        assert_eq!(positive("3"), Ok(3));
        assert!(positive("0").is_err());
        assert!(positive("-1").is_err());
        assert!(positive("two").is_err());
    }

    #[test]
    fn prefault_sizes_are_bounded() {
        assert_eq!(prefault_mib("0"), Ok(0));
        assert_eq!(prefault_mib("1024"), Ok(1024));
        assert_eq!(
            prefault_mib(&MAX_PREFAULT_MIB.to_string()),
            Ok(MAX_PREFAULT_MIB)
        );
        assert!(prefault_mib(&(MAX_PREFAULT_MIB + 1).to_string()).is_err());
        assert!(prefault_mib("-1").is_err());
    }
}
