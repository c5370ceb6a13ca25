//! Placeholder: the blaxel facade is built in its own issue.
