//! Files: uploads, staging into the working directory, collection of what a run wrote,
//! downloads, listing, deletion and retention; and every trick a hostile program can
//! play on collection (links, fifos, devices, odd names, swaps, floods, sparse files),
//! each with a fixture in `tests/hostile/collect_*`.
//!
//! The tests, by concern: `uploads`, `listing` (listing, metadata, deletion, retention),
//! `inputs` (uploaded files in runs), `limits` (size caps, quota, streaming) and
//! `collection` (what a run wrote, hostile tricks included). `client` holds the HTTP
//! helpers (multipart uploads, raw bytes, auth headers), which the other test modules
//! use too; `support` the helpers about runs and their outputs.

mod client;
mod collection;
mod inputs;
mod limits;
mod listing;
mod support;
mod uploads;

pub(crate) use client::{
    assert_error, assert_nanoid, field_part, file_part, multipart, multipart_content_type, Client, Reply, Uploaded,
    BOUNDARY, NO_SUCH_ID,
};
pub(crate) use support::{download_output, output, output_names, regular_files, sha256_hex, stored_count};
