//! Placeholder: the E2B facade is built in its own issue.
