//! The end-to-end tests, one module per facade's fixtures and one for the facade conformance
//! programs, linked into one test binary: one link instead of one per file.

mod blaxel_fixtures;
mod daytona_fixtures;
mod e2b_fixtures;
mod facade_conformance;
