//! Replacing a running pipeline's tables (see `Pipeline::set_tables`).
