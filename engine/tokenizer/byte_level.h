// GPT-2's byte-level alphabet as used by tokenizer.json "ByteLevel": each byte is written as one
// printable Unicode character (printable Latin-1 bytes as themselves, the rest as U+0100...), so
// that any byte string is a string of vocabulary characters.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace exl::byte_level {

// The UTF-8 of the character that stands for byte b.
const std::string& char_of(uint8_t b);

// The byte a character stands for, if it is one of the 256.
std::optional<uint8_t> byte_of(char32_t cp);

// Maps a byte-level string back to raw bytes. As Hugging Face's ByteLevel decoder does, a string
// containing any character outside the alphabet is returned unchanged.
std::string decode(std::string_view s);

// Writes each byte of s as its character.
std::string encode(std::string_view s);

}  // namespace exl::byte_level
