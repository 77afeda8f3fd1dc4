//! Text format (being written).
