// Package sealing keeps sensitive fields sealed at rest (worker contract
// section 9; English seed section 12, Chinese seed sections 4 and 12).
//
// A field whose key is in Sensitive is stored, wherever it goes in the
// database (a run's input, a checkpoint state, a ledger request body), as
// {"$sealed": "v1:<base64 of nonce + AES-256-GCM ciphertext>"} under the
// key in FENCECHECK_DATA_KEY (base64 of 32 bytes): the same form the Python
// reference worker writes. The dispatcher opens a request just before it
// goes to the tool, which must receive the value itself; digests are over
// the opened request, so they stay stable although every sealing differs.
//
// Invariants: a sensitive value never reaches the database unsealed
// (without a key, sealing one is refused: ErrNoKey), and this package never
// logs anything.
package sealing

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Sensitive are the keys whose values are sealed wherever they appear.
var Sensitive = map[string]bool{"customer_token": true, "payment_token": true, "card_number": true, "customer_email": true}

const (
	mark    = "$sealed"
	version = "v1:"
)

// ErrNoKey: a sensitive value met a worker without FENCECHECK_DATA_KEY.
var ErrNoKey = errors.New("a sensitive field needs FENCECHECK_DATA_KEY (base64 of 32 bytes) to be sealed or opened")

// Sealer seals and opens the sensitive fields of JSON values.
type Sealer struct {
	aead cipher.AEAD
}

// New makes a Sealer from the base64 key text ("" = no key: sealing refuses).
func New(keyText string) (*Sealer, error) {
	if keyText == "" {
		return &Sealer{}, nil
	}
	key, err := base64.StdEncoding.DecodeString(keyText)
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("FENCECHECK_DATA_KEY must be base64 of 32 bytes")
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead}, nil
}

// ErrForged: an object names the sealed mark but is no sealed value of this
// worker's form; taken as sealed, an input could pass a clear value off as
// sealed, or hide one beside the mark, and have it stored in clear.
var ErrForged = errors.New("an object naming \"$sealed\" must be a sealed value (one key, a token that opens under the key), nothing else")

// sealed says whether v names the mark: nil error when it is a sealed value
// of ours (without a key only its form can be judged: a worker without one
// still carries values sealed by another), ErrForged when it is not.
func (s *Sealer) sealed(v any) (bool, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return false, nil
	}
	token, named := m[mark]
	if !named {
		return false, nil
	}
	text, ok := token.(string)
	if len(m) != 1 || !ok || !strings.HasPrefix(text, version) {
		return true, ErrForged
	}
	if s.aead != nil {
		if _, err := s.openOne(text); err != nil {
			return true, ErrForged
		}
	}
	return true, nil
}

// Seal returns v with every sensitive field sealed (sealed ones kept).
func (s *Sealer) Seal(v any) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		if named, err := s.sealed(x); named {
			return x, err
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			var err error
			if Sensitive[k] {
				out[k], err = s.sealOne(e)
			} else {
				out[k], err = s.Seal(e)
			}
			if err != nil {
				return nil, err
			}
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			var err error
			if out[i], err = s.Seal(e); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return v, nil
}

// Open returns v with every sealed field opened.
func (s *Sealer) Open(v any) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		if text, ok := x[mark].(string); ok && len(x) == 1 {
			return s.openOne(text)
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			var err error
			if out[k], err = s.Open(e); err != nil {
				return nil, err
			}
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			var err error
			if out[i], err = s.Open(e); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return v, nil
}

func (s *Sealer) sealOne(v any) (any, error) {
	if named, err := s.sealed(v); named {
		return v, err
	}
	if s.aead == nil {
		return nil, ErrNoKey
	}
	plain, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	sealed := s.aead.Seal(nonce, nonce, plain, nil)
	return map[string]any{mark: version + base64.StdEncoding.EncodeToString(sealed)}, nil
}

func (s *Sealer) openOne(text string) (any, error) {
	if s.aead == nil {
		return nil, ErrNoKey
	}
	if !strings.HasPrefix(text, version) {
		return nil, fmt.Errorf("unknown sealing version")
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(text, version))
	n := s.aead.NonceSize()
	if err != nil || len(raw) < n {
		return nil, fmt.Errorf("a sealed field is not base64 of nonce + ciphertext")
	}
	plain, err := s.aead.Open(nil, raw[:n], raw[n:], nil)
	if err != nil {
		return nil, fmt.Errorf("a sealed field was sealed under another key")
	}
	var v any
	d := json.NewDecoder(strings.NewReader(string(plain)))
	d.UseNumber()
	return v, d.Decode(&v)
}
