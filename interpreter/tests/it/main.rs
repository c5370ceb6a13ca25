//! The driver's integration tests, as one test binary like every package's (`tests/it`): a
//! new test file is a module here, not a binary to link of its own.

mod driver;
