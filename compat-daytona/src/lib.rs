//! Placeholder: the daytona facade is built in its own issue.
