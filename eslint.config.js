// ESLint: typescript-eslint's type-aware rules over src, test, bench and examples; formatting is Prettier's.
import js from '@eslint/js';
import prettier from 'eslint-config-prettier';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', 'coverage/', '.bench/', 'node_modules/'] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      globals: globals.node,
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/consistent-type-imports': 'error',
      '@typescript-eslint/no-floating-promises': ['error', { ignoreVoid: true }],
      '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: false }],
      'no-constant-condition': ['error', { checkLoops: false }],
      // A store method is async to honour its contract (a throw becomes a rejection), awaiting or not.
      '@typescript-eslint/require-await': 'off',
    },
  },
  // Functions a reader takes in at once (ARCHITECTURE.md): none in src/ over 80 lines.
  { files: ['src/**/*.ts'], rules: { 'max-lines-per-function': ['error', { max: 80 }] } },
  { files: ['**/*.js'], ...tseslint.configs.disableTypeChecked },
  prettier,
);
