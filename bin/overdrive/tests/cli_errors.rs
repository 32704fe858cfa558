//! What a user sees when a command cannot run: one clear line, the exit status 1, and no
//! source locations meant for overdrive's developers.

use std::process::Command;

#[test]
fn a_missing_fixture_path_is_an_error_up_front() {
    let out = Command::new(env!("CARGO_BIN_EXE_overdrive"))
        .args(["ef-tests", "/nonexistent/overdrive-fixtures"])
        .output()
        .expect("run overdrive");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Error: no fixture file or directory at /nonexistent/overdrive-fixtures"),
        "{stderr}"
    );
    assert!(!stderr.contains("Location:"), "{stderr}");
    // Nothing ran: no test counted as failed under an unknown network.
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
