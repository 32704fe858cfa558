pub mod bench;
pub mod ef_tests;
pub mod init;
