//! The `kv` provider: persistence across opens, quotas, compare-and-swap under concurrency.
