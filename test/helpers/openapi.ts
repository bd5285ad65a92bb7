import { validate } from '@readme/openapi-parser';
import { Ajv2020 } from 'ajv/dist/2020.js';
import type { OpenApiDocument } from '../../src/openapi/common.js';

/**
 * Checks of the OpenAPI documents: the whole document against the OpenAPI 3.1 specification
 * (@readme/openapi-parser: its JSON schema and the rules a schema cannot say, such as path
 * parameters and unique operation ids), and values against the document's own schemas (Ajv,
 * JSON Schema 2020-12, the dialect of OpenAPI 3.1), so that what the gateway really answers can
 * be held to what the document says.
 */

export async function validateDocument(
  doc: OpenApiDocument,
): Promise<{ valid: boolean; messages: string[]; warnings: string[] }> {
  // The parser dereferences in place: give it a copy.
  const result = await validate(structuredClone(doc) as never);
  return {
    valid: result.valid,
    messages: result.valid ? [] : result.errors.map((e) => e.message),
    warnings: result.warnings.map((w) => w.message),
  };
}

export interface SchemaCheck {
  /** Undefined when `value` is valid against `#/components/schemas/<name>`; else Ajv's errors. */
  (name: string, value: unknown): string | undefined;
}

export function schemaChecker(doc: OpenApiDocument): SchemaCheck {
  // OpenAPI keywords beside the JSON Schema ones (`format: password`) are not Ajv's business.
  const ajv = new Ajv2020({ strict: false, validateFormats: false, allErrors: true });
  ajv.addSchema({ $id: 'urn:oapi-gateway:doc', components: doc.components });
  return (name, value) => {
    const validateValue = ajv.getSchema(`urn:oapi-gateway:doc#/components/schemas/${name}`);
    if (!validateValue) throw new Error(`no schema ${name}`);
    return validateValue(value) ? undefined : ajv.errorsText(validateValue.errors);
  };
}
