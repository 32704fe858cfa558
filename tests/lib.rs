//! Shared helpers for overdrive's end-to-end tests.

use std::path::PathBuf;

/// The ethereum/tests fixtures: `OVERDRIVE_FIXTURES` or `../shared/fixtures/ethereum-tests`
/// beside the repository. Panics with a clear message when missing, so a test can never pass
/// by finding nothing.
pub fn fixtures_dir() -> PathBuf {
    let dir = std::env::var_os("OVERDRIVE_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/ethereum-tests")
        });
    assert!(
        dir.is_dir(),
        "ethereum/tests fixtures not found at {}",
        dir.display()
    );
    dir
}

/// The execution-spec-tests fixtures: `OVERDRIVE_EEST_FIXTURES` or `../shared/fixtures/eest`
/// beside the repository. Panics with a clear message when missing.
pub fn eest_dir() -> PathBuf {
    let dir = std::env::var_os("OVERDRIVE_EEST_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/eest")
        });
    assert!(
        dir.is_dir(),
        "execution-spec-tests fixtures not found at {}",
        dir.display()
    );
    dir
}
