pub mod bench;
pub mod ef_tests;
pub mod init;

/// Parses a count flag that must be at least 1 (threads, blocks, transactions): zero would
/// run nothing and report an empty measurement, so it is refused at the command line.
pub(crate) fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_string()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::positive;

    #[test]
    fn positive_counts_only() {
        assert_eq!(positive("3"), Ok(3));
        assert!(positive("0").is_err());
        assert!(positive("-1").is_err());
        assert!(positive("two").is_err());
    }
}
