// LibreChat's Code API tokens, minted the way LibreChat mints them (its
// packages/api auth/codeapi module): an EdDSA JWT whose header names the key by
// `kid`, with LibreChat's claim set and a lifetime of at most 300 s. Signed with
// node:crypto, as LibreChat does; no JWT library is involved on either side.
import { createHash, createPrivateKey, generateKeyPairSync, randomUUID, sign } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** LibreChat's default key id (CODEAPI_JWT_KID). */
export const DEFAULT_KID = 'lc-codeapi-2026-05';

const b64url = (value) => Buffer.from(value).toString('base64url');

/** A fresh Ed25519 key pair as PEM text: the private key is LibreChat's, the public one sandcall's. */
export function makeKeyPair() {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  return {
    privateKeyPem: privateKey.export({ type: 'pkcs8', format: 'pem' }),
    publicKeyPem: publicKey.export({ type: 'spki', format: 'pem' }),
  };
}

/** Writes a key pair into `dir` as private.pem and public.pem. */
export function writeKeyPair(dir) {
  const { privateKeyPem, publicKeyPem } = makeKeyPair();
  writeFileSync(join(dir, 'private.pem'), privateKeyPem, { mode: 0o600 });
  writeFileSync(join(dir, 'public.pem'), publicKeyPem);
}

export function loadPrivateKey(path) {
  return createPrivateKey(readFileSync(path, 'utf8'));
}

/**
 * LibreChat's `auth_context_hash`: SHA-256 (hex) of the JSON of the principal's
 * identity fields, in this fixed key order, absent optional fields as "".
 */
export function authContextHash({ sub, tenantId, role, principalSource, orgId, serviceId, chcUserId }) {
  const canonical = {
    chc_user_id: chcUserId ?? '',
    org_id: orgId ?? '',
    principal_source: principalSource,
    role,
    service_id: serviceId ?? '',
    sub,
    tenant_id: tenantId,
  };
  return createHash('sha256').update(JSON.stringify(canonical)).digest('hex');
}

/**
 * Mints one token. `now` and `ttlSeconds` let a test make an expired token;
 * `claims` overrides or adds claims after the standard ones are set.
 */
export function mintToken({
  privateKey,
  kid = DEFAULT_KID,
  sub,
  tenantId = 'legacy',
  role = 'USER',
  principalSource = 'librechat_jwt',
  issuer = 'librechat',
  audience = 'codeapi',
  now = Math.floor(Date.now() / 1000),
  ttlSeconds = 300,
  claims = {},
}) {
  const header = { alg: 'EdDSA', typ: 'JWT', kid };
  const payload = {
    iss: issuer,
    aud: audience,
    sub,
    iat: now,
    nbf: now,
    exp: now + ttlSeconds,
    jti: randomUUID(),
    tenant_id: tenantId,
    role,
    principal_source: principalSource,
    auth_context_hash: authContextHash({ sub, tenantId, role, principalSource }),
    ...claims,
  };
  const signingInput = `${b64url(JSON.stringify(header))}.${b64url(JSON.stringify(payload))}`;
  // Ed25519 takes no digest name: node:crypto signs the message itself.
  const signature = sign(null, Buffer.from(signingInput), privateKey);
  return `${signingInput}.${b64url(signature)}`;
}

// `node lib/jwt.mjs DIR`: the runner's key generation step.
if (import.meta.url === `file://${process.argv[1]}`) {
  const dir = process.argv[2];
  if (!dir) {
    console.error('usage: node lib/jwt.mjs DIR   (writes DIR/private.pem and DIR/public.pem)');
    process.exit(2);
  }
  writeKeyPair(dir);
}
