//! Local mode and web pages: a foreign Origin, a foreign Host (DNS rebinding) and a
//! body without Content-Type are refused.
