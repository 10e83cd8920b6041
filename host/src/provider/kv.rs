//! `kv.*`: a persistent key-value store per application.
