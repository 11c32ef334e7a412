//! Output collection and storage quotas: sparse files cannot inflate what a run stores,
//! and a principal's stored bytes and files are bounded.
