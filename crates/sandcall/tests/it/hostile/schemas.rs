//! Tool schemas whose validation would cost the server exponential work are refused at
//! declaration, and validation cannot stall the async runtime.
