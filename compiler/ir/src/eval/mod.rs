//! Reference evaluator (being written).
