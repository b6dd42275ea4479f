#pragma once
// Throw-away TLS identities for tests, made with OpenSSL 3 at test time: a CA, server
// certificates it signs, a self-signed one and a few keys that must be refused. EC P-256
// keys, so a whole set takes a few milliseconds.

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace joule::testing {

/// PEM files in one directory.
struct TestPki {
  std::filesystem::path ca_certificate;     ///< "Joule test CA", self-signed, CA:TRUE
  /// Leaf for localhost, 127.0.0.1 and ::1, then the intermediate CA that signed it (the CA
  /// signed the intermediate; the root is not sent, as in a real deployment).
  std::filesystem::path server_chain;
  std::filesystem::path server_key;
  std::filesystem::path other_host_chain;   ///< signed by the CA, for jouled.example only
  std::filesystem::path other_host_key;
  std::filesystem::path self_signed_chain;  ///< localhost and 127.0.0.1, signed by itself
  std::filesystem::path self_signed_key;
  std::filesystem::path unrelated_key;      ///< matches none of the certificates
  std::filesystem::path encrypted_key;      ///< server_key's twin behind the passphrase "secret"
};

namespace pki_detail {

struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct CertFree {
  void operator()(X509* cert) const { X509_free(cert); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;
using Cert = std::unique_ptr<X509, CertFree>;

inline void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("test PKI: ") + what + " failed");
}

inline Key new_key() {
  Key key(EVP_EC_gen("P-256"));
  check(key != nullptr, "EC key generation");
  return key;
}

inline void add_extension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX context;
  X509V3_set_ctx(&context, issuer ? issuer : cert, cert, nullptr, nullptr, 0);
  X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &context, nid, value);
  check(extension != nullptr, value);
  check(X509_add_ext(cert, extension, -1) == 1, "X509_add_ext");
  X509_EXTENSION_free(extension);
}

/// A certificate for `key` named `common_name`; issuer null: self-signed. `alt_names` empty: a CA.
inline Cert new_certificate(EVP_PKEY* key, const char* common_name, X509* issuer, EVP_PKEY* issuer_key,
                            const char* alt_names, long serial) {
  Cert cert(X509_new());
  check(cert && X509_set_version(cert.get(), 2) == 1, "X509_new");
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 24 * 3600);
  check(X509_set_pubkey(cert.get(), key) == 1, "X509_set_pubkey");
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(common_name), -1, -1, 0);
  X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name);
  add_extension(cert.get(), issuer, NID_subject_key_identifier, "hash");
  if (alt_names[0] == '\0') {
    add_extension(cert.get(), issuer, NID_basic_constraints, "critical,CA:TRUE");
    add_extension(cert.get(), issuer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_extension(cert.get(), issuer, NID_basic_constraints, "critical,CA:FALSE");
    add_extension(cert.get(), issuer, NID_key_usage, "critical,digitalSignature");
    add_extension(cert.get(), issuer, NID_ext_key_usage, "serverAuth");
    add_extension(cert.get(), issuer, NID_subject_alt_name, alt_names);
  }
  if (issuer) add_extension(cert.get(), issuer, NID_authority_key_identifier, "keyid:always");
  check(X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256()) > 0, "X509_sign");
  return cert;
}

inline void write_pem(const std::filesystem::path& file, std::initializer_list<X509*> certs, EVP_PKEY* key = nullptr,
                      const char* passphrase = nullptr) {
  std::FILE* out = std::fopen(file.c_str(), "w");
  check(out != nullptr, "fopen");
  for (X509* cert : certs) check(PEM_write_X509(out, cert) == 1, "PEM_write_X509");
  if (key) {
    const EVP_CIPHER* cipher = passphrase ? EVP_aes_256_cbc() : nullptr;
    auto* pass = reinterpret_cast<unsigned char*>(const_cast<char*>(passphrase));
    check(PEM_write_PrivateKey(out, key, cipher, pass, passphrase ? static_cast<int>(std::strlen(passphrase)) : 0,
                               nullptr, nullptr) == 1,
          "PEM_write_PrivateKey");
  }
  std::fclose(out);
}

}  // namespace pki_detail

/// Writes a fresh set of identities into `directory` (which must exist).
inline TestPki make_test_pki(const std::filesystem::path& directory) {
  using namespace pki_detail;
  TestPki pki{directory / "ca.pem",          directory / "server-chain.pem", directory / "server-key.pem",
              directory / "other-chain.pem", directory / "other-key.pem",    directory / "self-signed.pem",
              directory / "self-signed-key.pem", directory / "unrelated-key.pem", directory / "encrypted-key.pem"};
  const Key ca_key = new_key();
  const Cert ca = new_certificate(ca_key.get(), "Joule test CA", nullptr, nullptr, "", 1);
  write_pem(pki.ca_certificate, {ca.get()});

  const Key intermediate_key = new_key();
  const Cert intermediate = new_certificate(intermediate_key.get(), "Joule test intermediate CA", ca.get(),
                                            ca_key.get(), "", 2);
  const Key server_key = new_key();
  const Cert server = new_certificate(server_key.get(), "localhost", intermediate.get(), intermediate_key.get(),
                                      "DNS:localhost,IP:127.0.0.1,IP:::1", 3);
  write_pem(pki.server_chain, {server.get(), intermediate.get()});
  write_pem(pki.server_key, {}, server_key.get());
  write_pem(pki.encrypted_key, {}, server_key.get(), "secret");

  const Key other_key = new_key();
  const Cert other = new_certificate(other_key.get(), "jouled.example", ca.get(), ca_key.get(), "DNS:jouled.example", 4);
  write_pem(pki.other_host_chain, {other.get()});
  write_pem(pki.other_host_key, {}, other_key.get());

  const Key self_key = new_key();
  const Cert self = new_certificate(self_key.get(), "localhost", nullptr, nullptr, "DNS:localhost,IP:127.0.0.1", 5);
  write_pem(pki.self_signed_chain, {self.get()});
  write_pem(pki.self_signed_key, {}, self_key.get());

  write_pem(pki.unrelated_key, {}, new_key().get());
  return pki;
}

}  // namespace joule::testing
